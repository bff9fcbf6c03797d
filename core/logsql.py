"""The step log's records as SQL: one batch of records is one transaction.

A record is (kind, payload) as core/steplog.py queues it; `write_batch` commits a batch or
rolls it back whole and raises, so the file always holds a prefix of the run.
"""
from __future__ import annotations

import json
import sqlite3

from core.logrecords import (EmbeddingRecord, Gap, InputRecord, PromptLogprobsRecord, StepRecord, admission_sql,
                             finish_sql, insert_sql, values)


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
    seq_id, request_id, arrival, prompt, max_tokens, priority, sampling, user, at, key, salt = p
    conn.execute(admission_sql(), (seq_id, request_id, arrival, json.dumps(prompt), max_tokens,
                                   priority, json.dumps(sampling), user, at, key, salt))


def _write_finish(conn, p) -> None:
    seq_id, step, reason, output = p
    conn.execute(finish_sql(), (step, reason, json.dumps(output), seq_id))


def _insert(cls):
    """The writer of a record of `cls` (core/logrecords.py)."""
    sql = insert_sql(cls)
    return lambda conn, record: conn.execute(sql, values(record))


_WRITERS = {"req": _write_request, "in": _insert(InputRecord), "fin": _write_finish,
            "step": _insert(StepRecord), "gap": _insert(Gap),
            "plp": _insert(PromptLogprobsRecord), "emb": _insert(EmbeddingRecord)}
