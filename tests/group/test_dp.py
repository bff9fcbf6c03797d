"""scripts/serve --dp 2: two engine replicas behind one frontend (the `group` fixture
verifies each replica's step log in teardown)."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import threading
import time
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from frontend.client import Client
from frontend.http.metrics import Metrics
from frontend.replica_stats import merge, replica_stats
from frontend.replicas import least_loaded
from scripts.group.harness import start_group
from tests.conftest import verify_log
from tests.group.test_faults import REQS, run_concurrently

GROUP_ARGS = ["--dp", "2", "--num-blocks", "128"]
SHORT = [dict(r, max_tokens=24) for r in REQS]


def test_least_loaded_skips_dead_replicas_and_ties_to_the_lowest_index():
    reps = [SimpleNamespace(index=k, up=up, load=load)
            for k, (up, load) in enumerate([(False, 0), (True, 7), (True, 7), (True, 9)])]
    assert least_loaded(reps).index == 1
    reps[2].load = 3
    assert least_loaded(reps).index == 2
    assert least_loaded([reps[0]]) is None


def test_merge_sums_counts_and_keeps_each_replica():
    one = replica_stats({"running": 1, "total_blocks": 10, "free_blocks": 4, "model": "m",
                         "max_model_len": 64, "pids": {"core": 5}}, 0, {"worker": 6}, 64)
    two = replica_stats({"running": 2, "total_blocks": 10, "free_blocks": 9, "model": "m",
                         "max_model_len": 32}, 1, {"core": 7, "worker": 8}, 32)
    st = merge([one, two], frontend_pid=1)
    assert (st["running"], st["total_blocks"], st["free_blocks"]) == (3, 20, 13)
    assert st["max_model_len"] == 32 and st["model"] == "m"
    assert st["pids"] == {"core": 5, "worker": 6, "frontend": 1}
    assert [r["replica"] for r in st["replicas"]] == [0, 1]
    assert st["replicas"][1]["pids"] == {"core": 7, "worker": 8}


def stream_all(address: str, reqs: list[dict]) -> list:
    threads, results = run_concurrently(address, reqs, threading.Event())
    for t in threads:
        t.join(180)
    return results


def logged_requests(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT count(*) FROM requests").fetchone()[0]
    finally:
        conn.close()


def wait_logged(paths, want: list[int], timeout: float = 30) -> list[int]:
    """Each log's request count once they are `want` or the timeout has passed: the writer
    commits when idle, in batches, so a log can hold some of its requests and not yet all
    (seen: [1, 1] read while the replicas had finished [3, 5])."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [logged_requests(p) for p in paths]
        if counts == want or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def test_requests_spread_over_both_replicas(group):
    results = stream_all(group.address, SHORT * 2)
    assert all(r[0] == "length" and len(r[1]) == 24 for r in results), results
    with Client(group.address, timeout=30) as c:
        st = c.stats()
    finished = [r["finished"] for r in st["replicas"]]
    assert sum(finished) == 8 and all(finished), finished
    logs = group.logs()
    assert [p.name for p in logs] == ["steps.r0.db", "steps.r1.db"]
    assert wait_logged(logs, finished) == finished


@pytest.mark.slow  # keeps the default suite under 5 minutes; CI runs it
def test_tokens_equal_a_dp1_run(group, tmp_path):
    one = start_group(tmp_path, ["--num-blocks", "128"], log=False)
    try:
        want = [r[1] for r in stream_all(one.address, SHORT)]
    finally:
        assert one.stop() == 0
    got = [r[1] for r in stream_all(group.address, SHORT * 2)]
    assert got == want * 2


def test_stats_totals_and_replicas(group):
    with Client(group.address, timeout=30) as c:
        st = c.stats()
    reps = st["replicas"]
    assert [r["replica"] for r in reps] == [0, 1]
    for k in ("total_blocks", "free_blocks", "steps", "finished", "running", "waiting"):
        assert st[k] == reps[0][k] + reps[1][k], k
    assert st["total_blocks"] == 256 and st["max_model_len"] == 2048
    assert set(st["pids"]) == {"frontend", "core", "worker"}
    assert st["pids"]["core"] == reps[0]["pids"]["core"]
    cores = {r["pids"]["core"] for r in reps} | {r["pids"]["worker"] for r in reps}
    assert len(cores) == 4


def replica_pids(address: str) -> list[dict]:
    with Client(address, timeout=30) as c:
        return [r["pids"] for r in c.stats()["replicas"]]


def wait_replicas(address: str, n: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        pids = replica_pids(address)
        if len(pids) == n or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


@pytest.mark.slow  # 40 s on two cores
def test_a_dead_replica_loses_no_request(tmp_path):
    """kill -9 of replica 1's core mid-run: its requests run again on replica 0 and every
    stream completes with the tokens of an undisturbed run; serve restarts the replica,
    which serves again."""
    reqs = [dict(r, max_tokens=80) for r in REQS] * 2
    g = start_group(tmp_path, GROUP_ARGS)
    try:
        want = stream_all(g.address, reqs)
        before = replica_pids(g.address)
        started = threading.Event()
        threads, results = run_concurrently(g.address, reqs, started)
        assert started.wait(60)
        os.kill(before[1]["core"], signal.SIGKILL)
        for t in threads:
            t.join(180)
        after = wait_replicas(g.address, 2)
        assert after[0] == before[0] and after[1]["core"] != before[1]["core"], after
        with Client(g.address, timeout=60) as c:   # replica 0 is busy: the new one serves
            long = c.stream([5, 6, 7], max_tokens=1500, ignore_eos=True, request_id="long")
            next(long)
            assert c.generate([8, 9], max_tokens=4).finish_reason == "length"
            c.abort("long")
            assert list(long)[-1].finish_reason == "abort"
        assert g.alive()
    finally:
        code = g.stop()
    assert code == 0, g.tail()
    assert results == want and all(r[0] == "length" for r in want), results
    err = g.stderr.read_text()
    assert "core1 exited" in err
    assert re.search(r"local replica 1's core \(pid \d+\) died or left: [1-9]\d* request",
                     err), err[-3000:]
    logs = g.logs()
    assert [p.name for p in logs] == ["steps.r0.db", "steps.r1.1.db", "steps.r1.db"]
    for log in logs:
        r = verify_log(log)
        assert r.returncode == 0, r.stdout + r.stderr


def test_metrics_label_each_replica(group):
    with Client(group.address, timeout=30) as c:
        st = c.stats()
    m = Metrics()
    m.refresh(st)
    text = generate_latest(m.registry).decode()
    for k in (0, 1):
        assert f'tl_replica_kv_blocks_capacity{{replica="{k}"}} 128.0' in text, text
    # the step histogram sums the replicas' buckets: its count is every replica's steps
    assert f"tl_step_duration_seconds_count {float(st['steps'])}" in text, text
