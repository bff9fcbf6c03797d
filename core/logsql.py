"""The step log's records as SQL: one batch of records is one transaction.

A record is (kind, payload) as core/steplog.py queues it; `write_batch` commits a batch or
rolls it back whole and raises, so the file always holds a prefix of the run.
"""
from __future__ import annotations

import json
import sqlite3


def write_batch(conn: sqlite3.Connection, batch: list[tuple]) -> None:
    """Commit every record of `batch`, or none of them (and raise)."""
    try:
        conn.execute("BEGIN")
        for kind, payload in batch:
            _WRITERS[kind](conn, payload)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # SQLite already rolled back (it does on SQLITE_FULL, for one)


def _write_request(conn, p) -> None:
    rid, crid, arrival, prompt, max_tokens, priority, sampling = p
    conn.execute("INSERT INTO requests (id, client_request_id, arrival_step, prompt_tokens,"
                 " max_tokens, priority, sampling) VALUES (?,?,?,?,?,?,?)",
                 (rid, crid, arrival, json.dumps(prompt), max_tokens, priority,
                  json.dumps(sampling)))


def _write_input(conn, p) -> None:
    conn.execute("INSERT INTO inputs (step, seq, kind, request_id) VALUES (?,?,?,?)", p)


def _write_finish(conn, p) -> None:
    rid, step, reason, output = p
    conn.execute("UPDATE requests SET finish_step=?, finish_reason=?, output_tokens=?"
                 " WHERE id=?", (step, reason, json.dumps(output), rid))


def _write_step(conn, r) -> None:
    conn.execute("INSERT INTO steps (step, wall_time, duration_ms, schedule, outputs,"
                 " free_blocks, running, waiting, hash) VALUES (?,?,?,?,?,?,?,?,?)",
                 (r.step, r.wall_time, r.duration_ms, json.dumps(r.schedule),
                  json.dumps(r.outputs), r.free_blocks, r.running, r.waiting, r.hash))


def _write_gap(conn, g) -> None:
    conn.execute("INSERT INTO gaps (first_step, last_step, records, reason) VALUES (?,?,?,?)",
                 (g.first_step, g.last_step, g.records, g.reason))


_WRITERS = {"req": _write_request, "in": _write_input, "fin": _write_finish,
            "step": _write_step, "gap": _write_gap}
