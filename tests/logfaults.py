"""Helpers for step log fault tests: an offline engine with a StepLog, and a disk that
fills up on demand (SQLite's max_page_count, set on the writer's own thread)."""
from __future__ import annotations

import random
import sqlite3

from core import logwriter
from core.config import CoreConfig, log_meta
from core.ipc.protocol import ModelInfo, SamplingParams
from core.sched import Request
from core.steplog import StepLog

INFO = ModelInfo(model="null", num_blocks=64, block_size=4, max_model_len=256,
                 vocab_size=512, eos_ids=[0])
# Plain steps: these tests count a run's steps in its log, and an overlapped run has one
# more planned than settled (overlapped logs: tests/core/test_overlap.py).
CFG = CoreConfig("-", "-", "-", "-", max_seqs=8, max_batch_tokens=64, overlap=False)


def new_log(path, **kw) -> StepLog:
    """A StepLog whose writer checks its file and retries a failed batch ten times as often
    as the core's (the tests wait for both)."""
    return StepLog(str(path), log_meta(CFG, INFO), **{"check_s": 0.1, "retry_s": 0.05, **kw})


def engine_for(log):
    from worker.null import NullRunner
    engine = CFG.make_engine(INFO, log)
    engine.runner = NullRunner(num_blocks=INFO.num_blocks, block_size=INFO.block_size)
    return engine


def run_steps(engine, n: int, seed: int = 0) -> None:
    """n steps with a request arriving now and then (and whenever nothing runs)."""
    rng = random.Random(seed + engine.step_no)
    for _ in range(n):
        if not engine.sched.has_unfinished() or rng.random() < 0.3:
            prompt = [rng.randrange(1, 512) for _ in range(rng.randint(2, 20))]
            engine.add(Request(prompt, rng.randint(1, 16)), SamplingParams())
        engine.step()


def count(path, table: str = "steps") -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


class DiskFull:
    """While `full`, every write finds the database at its size limit: SQLite answers
    'database or disk is full' once a batch needs a new page."""

    def __init__(self, monkeypatch):
        self.full = False
        real = logwriter.write_batch

        def write_batch(conn, batch):
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages if self.full else 1 << 30}")
            real(conn, batch)
        monkeypatch.setattr(logwriter, "write_batch", write_batch)
