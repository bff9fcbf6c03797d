"""The step log: every input, ScheduleOutput and StepOutput of a run, in SQLite.

Tables (core/logrecords.py): meta, requests, inputs, steps, prompt_logprobs, and gaps
(steps that were not logged, see below);
JSON columns so that `sqlite-utils query` and datasette read a log as it is. WAL with
synchronous=NORMAL and one transaction per step: a kill -9 loses nothing committed.

The step loop only appends Python objects to a queue; a writer thread (core/logwriter.py)
encodes them and commits, so the log's cost on the critical path is an append per record.
The writer never dies of a write error: it retries, and `problem` says meanwhile why the
log cannot be written. What the core does then is `on_error`'s choice:
  "stop"  (default) new requests are refused (`refusal()`); those in flight go on while
          their records wait in memory, and once more than `max_backlog` wait they are
          aborted (`abort_reason()`). Nothing is lost: the log stays a prefix of the run.
  "serve" requests are accepted; beyond `max_backlog` whole steps are dropped, and once
          writing resumes a `gaps` row names them, so that replay stops there.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import sqlite_utils

from core.logrecords import (FORMAT, TABLES, EmbeddingRecord, Gap, InputRecord,
                             PromptLogprobsRecord, StepRecord)
from core.logwriter import CHECK_S, CHECKPOINT_S, RETRY_S, Writer, say

ON_ERROR = ("stop", "serve")
MAX_BACKLOG = 1_000_000  # records (a step's outputs count one each): ~100 MB

def create(path: str) -> sqlite_utils.Database:
    """A new, empty log readable by its owner only."""
    if os.path.exists(path):
        raise FileExistsError(f"step log {path} already exists")
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
    db = sqlite_utils.Database(path)
    db.enable_wal()
    db.execute("PRAGMA synchronous=NORMAL")
    for name, (columns, pk) in TABLES.items():
        db[name].create(columns, pk=pk)
    return db


class StepLog:
    """The Engine's log (see core.engine.NullLog for the interface)."""

    def __init__(self, path: str, meta: dict, on_error: str = "stop",
                 max_backlog: int = MAX_BACKLOG, checkpoint_s: float = CHECKPOINT_S,
                 check_s: float = CHECK_S, retry_s: float = RETRY_S):
        """`checkpoint_s`, `check_s`, `retry_s`: the writer's periods (core/logwriter.py)."""
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        db = create(path)
        db["meta"].insert_all([{"key": k, "value": json.dumps(v)} for k, v in
                               {"format": FORMAT, **meta}.items()])
        db.close()
        self.on_error, self.max_backlog = on_error, max_backlog
        self._pending: list[tuple] = []
        self._seq_step, self._seq_n = -1, 0
        self._queued = 0   # records handed to the writer; only the step loop adds
        self._gap: Gap | None = None
        self._writer = Writer(path, checkpoint_s=checkpoint_s, check_s=check_s, retry_s=retry_s)

    # ---- health, read by the step loop

    @property
    def path(self) -> str:
        """Where the log is now (it moves when its file is replaced while in use)."""
        return self._writer.path

    @property
    def problem(self) -> str | None:
        """None while the log is written; else why not, in one line."""
        return self._writer.problem

    @property
    def backlog(self) -> int:
        """Records handed to the writer and not committed yet."""
        return self._queued - self._writer.written

    def refusal(self) -> str | None:
        """Why a new request must be refused now (on_error "stop"), or None."""
        return self._writer.problem if self.on_error == "stop" else None

    def abort_reason(self) -> str | None:
        """Why the requests in flight must be aborted now: the log has been unwritable
        for so long that more than max_backlog records wait (on_error "stop")."""
        problem = self._writer.problem
        if self.on_error != "stop" or problem is None or self.backlog <= self.max_backlog:
            return None
        return f"{problem}; {self.backlog} step log records wait in memory"

    # ---- called by the engine, on the step loop's thread

    def add_request(self, seq_id, request_id, arrival, req, sampling, ignore_eos, user=None,
                    arrival_time=None, key_hash=None):
        doc = {**asdict(sampling), "ignore_eos": ignore_eos}
        if req.embed:   # absent for a generation, so a generation's row is as it was
            doc["embed"] = True
        # arrival_time: wall clock when the core received it, else now (what-if's arrivals)
        at = time.time() if arrival_time is None else arrival_time
        self._pending.append(("req", (seq_id, request_id, arrival, list(req.prompt),
                                      req.max_tokens, req.priority, doc, user, at,
                                      key_hash, req.cache_salt)))

    def input(self, step, kind, seq_id):
        # Inputs arrive in step order, so one counter for the current step suffices.
        if step != self._seq_step:
            self._seq_step, self._seq_n = step, 0
        self._pending.append(("in", InputRecord(step, self._seq_n, kind, seq_id)))
        self._seq_n += 1

    def finish(self, seq_id, step, reason, output_tokens):
        self._pending.append(("fin", (seq_id, step, reason, list(output_tokens or ()))))

    def prompt_logprobs(self, record: PromptLogprobsRecord) -> None:
        """Committed with the next step (the one that delivered them)."""
        self._pending.append(("plp", record))

    def embedding(self, record: EmbeddingRecord) -> None:
        """Committed with the step that pooled it."""
        self._pending.append(("emb", record))

    def step(self, record: StepRecord) -> None:
        self._pending.append(("step", record))
        batch, self._pending = self._pending, []
        records = len(batch) + len(record.outputs)
        if not self._dropped(record.step, records):
            self._put(batch, records)

    def flush(self) -> None:
        """Commit inputs and finishes that no step has followed yet (the loop is idle).
        While steps are being dropped they wait for the next step's fate instead."""
        if self._pending and self._gap is None:
            self._put(self._pending, len(self._pending))
            self._pending = []

    def close(self) -> None:
        self.flush()
        self._writer.close()

    # ---- internals

    def _put(self, batch: list, records: int) -> None:
        self._queued += records
        self._writer.put(batch, records)

    def _dropped(self, step: int, records: int) -> bool:
        """on_error "serve": whether this step's batch is dropped (the log has been
        unwritable with max_backlog records waiting); records the gap once it is over."""
        if self.on_error != "serve":
            return False
        problem = self._writer.problem
        gap = self._gap
        if gap is None:
            if problem is None or self.backlog + records <= self.max_backlog:
                return False
            self._gap = gap = Gap(first_step=step, last_step=step, records=0, reason=problem)
            say(f"{problem}: {self.backlog} records wait; serving on without logging"
                f" (--log-errors serve) from step {step}; the gap will be recorded")
        elif problem is None:
            self._put([("gap", gap)], 1)
            self._gap = None
            say(f"logging again from step {step}: steps {gap.first_step}..{gap.last_step}"
                f" ({gap.records} records) were dropped and are recorded as a gap")
            return False
        gap.last_step = step
        gap.records += records
        return True
