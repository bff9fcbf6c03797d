"""The step log: every input, ScheduleOutput and StepOutput of a run, in SQLite.

Tables (DESIGN.md "Step log columns"): meta, requests, inputs, steps; JSON columns so that
`sqlite-utils query` and datasette read a log as it is. WAL with synchronous=NORMAL and
one transaction per step: a kill -9 loses nothing committed.

The step loop only appends Python objects to a queue; a writer thread encodes them and
commits, so the log's cost on the critical path is an append per record.
"""
from __future__ import annotations

import json
import os
import queue
import sqlite3
import threading
from dataclasses import asdict

import sqlite_utils

FORMAT = 2  # bump when the tables or the state hash change meaning
_STOP = object()

SCHEMA = {
    "meta": ({"key": str, "value": str}, "key"),
    "requests": ({"id": int, "client_request_id": str, "arrival_step": int,
                  "prompt_tokens": str, "max_tokens": int, "priority": int, "sampling": str,
                  "finish_step": int, "finish_reason": str, "output_tokens": str}, "id"),
    "inputs": ({"step": int, "seq": int, "kind": str, "request_id": int}, ("step", "seq")),
    "steps": ({"step": int, "wall_time": float, "duration_ms": float, "schedule": str,
               "outputs": str, "free_blocks": int, "running": int, "waiting": int,
               "hash": str}, "step"),
}


def create(path: str) -> sqlite_utils.Database:
    """A new, empty log readable by its owner only."""
    if os.path.exists(path):
        raise FileExistsError(f"step log {path} already exists")
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
    db = sqlite_utils.Database(path)
    db.enable_wal()
    db.execute("PRAGMA synchronous=NORMAL")
    for name, (columns, pk) in SCHEMA.items():
        db[name].create(columns, pk=pk)
    return db


class StepLog:
    """The Engine's log (see core.engine.NullLog for the interface)."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        db = create(path)
        db["meta"].insert_all([{"key": k, "value": json.dumps(v)} for k, v in
                               {"format": FORMAT, **meta}.items()])
        db.close()
        self._pending: list[tuple] = []
        self._seq_step, self._seq_n = -1, 0
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="steplog", daemon=True)
        self._thread.start()

    # ---- called by the engine, on the step loop's thread

    def add_request(self, rid, client_request_id, arrival, req, sampling, ignore_eos):
        doc = {**asdict(sampling), "ignore_eos": ignore_eos}
        self._pending.append(("req", (rid, client_request_id, arrival, list(req.prompt),
                                      req.max_tokens, req.priority, doc)))

    def input(self, step, kind, rid):
        # Inputs arrive in step order, so one counter for the current step suffices.
        if step != self._seq_step:
            self._seq_step, self._seq_n = step, 0
        self._pending.append(("in", (step, self._seq_n, kind, rid)))
        self._seq_n += 1

    def finish(self, rid, step, reason, output_tokens):
        self._pending.append(("fin", (rid, step, reason, list(output_tokens or ()))))

    def step(self, record) -> None:
        if self._error is not None:
            raise RuntimeError(f"step log writer failed: {self._error}")
        self._pending.append(("step", record))
        self._q.put(self._pending)
        self._pending = []

    def flush(self) -> None:
        """Commit inputs and finishes that no step has followed yet (the loop is idle)."""
        if self._pending:
            self._q.put(self._pending)
            self._pending = []

    def close(self) -> None:
        self.flush()
        self._q.put(_STOP)
        self._thread.join()

    # ---- the writer thread

    def _write_loop(self) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            while (batch := self._q.get()) is not _STOP:
                with conn:
                    for kind, payload in batch:
                        _WRITERS[kind](conn, payload)
        except BaseException as e:  # surfaced to the step loop at the next step
            self._error = e
        finally:
            conn.close()


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


_WRITERS = {"req": _write_request, "in": _write_input, "fin": _write_finish,
            "step": _write_step}
