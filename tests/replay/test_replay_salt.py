"""A salted run's step log (docs/security.md, "Prefix cache isolation"): the requests
table holds each request's salt digest, replay reproduces the hits only with it, a damaged
salt is DamagedLog, and a log from before the column still reads (unsalted)."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from core.config import log_meta
from core.ipc.protocol import SamplingParams
from core.sched import Request
from core.steplog import StepLog
from replay.logfile import DamagedLog, LogFile
from replay.record import SCENARIOS
from replay.verify import verify
from worker.null import NullRunner

SC = SCENARIOS["prefix"]   # the prefix cache on, blocks of 4
HEAD = list(range(1, 21))  # five full blocks every request shares by tokens
SALTS = ["a" * 16, "b" * 16, None, "a" * 16, "b" * 16, None]


def record_salted(path: Path) -> list[int]:
    """Requests of one head under two salts and none, one after another: each hits only
    the blocks of its own salt. The cached tokens of each, in order."""
    log = StepLog(str(path), log_meta(SC.cfg, SC.info))
    engine = SC.cfg.make_engine(SC.info, log)
    engine.runner = NullRunner(num_blocks=SC.info.num_blocks, block_size=SC.info.block_size)
    cached = []
    try:
        for i, salt in enumerate(SALTS):
            engine.add(Request(HEAD + [100 + i], 2, cache_salt=salt), SamplingParams())
            hits = 0
            while engine.busy():
                engine.step()
                hits += sum(c for _, c in engine.last_hits)
            cached.append(hits)
    finally:
        log.close()
    return cached


@pytest.fixture(scope="module")
def salted(tmp_path_factory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("salt") / "salted.db"
    return path, record_salted(path)


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    return dst


def test_only_the_second_request_of_a_salt_hits_and_replay_agrees(salted):
    path, cached = salted
    assert cached == [0, 0, 0, 20, 20, 20]
    log = LogFile(str(path))
    assert [r["cache_salt"] for r in log.requests.values()] == SALTS
    assert verify(log).ok


def test_replay_without_the_salts_diverges(salted, tmp_path):
    path = copy(salted[0], tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE requests SET cache_salt = NULL")
    assert not verify(LogFile(str(path))).ok   # unsalted, the second request would hit


@pytest.mark.parametrize("value", [b"a blob", "s" * 257])   # a TEXT column keeps a blob
def test_a_damaged_salt_is_a_damaged_log(salted, tmp_path, value):
    path = copy(salted[0], tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE requests SET cache_salt = ? WHERE id = 0", (value,))
    with pytest.raises(DamagedLog, match="request 0: cache_salt"):
        LogFile(str(path))


def test_a_log_from_before_the_column_reads_unsalted(tmp_path):
    path = tmp_path / "old.db"
    record_salted(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE requests SET cache_salt = NULL")
        conn.execute("ALTER TABLE requests DROP COLUMN cache_salt")
    log = LogFile(str(path))
    assert all(r["cache_salt"] is None for r in log.requests.values())
