"""Stalls must not lose requests: a stopped worker with thousands queued, a frontend
stopped for 5 s with thousands in flight. Every request ends in exactly one final reply
and every one is in the step log with its finish. Each test stops real processes, so
each has its own group. They take a group each and half a minute: slow suite.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time

import pytest

from frontend.client import AsyncClient, Client, ClientError
from scripts.group.harness import start_group
from tests.conftest import verify_log

CAPS = ["--max-inflight-per-client", "20000", "--max-waiting", "20000"]


async def _one(c: AsyncClient, i: int, max_tokens: int):
    try:
        r = await c.generate([5 + i % 200, 6, 7], max_tokens=max_tokens, ignore_eos=True,
                             request_id=f"r{i}")
        return r.finish_reason
    except ClientError as e:
        return e.code


def send_all(address: str, n: int, max_tokens: int, sent: threading.Event) -> list:
    """n requests from one AsyncClient; `sent` is set once every one was handed to zmq."""
    async def run():
        async with AsyncClient(address, timeout=300) as c:
            tasks = [asyncio.create_task(_one(c, i, max_tokens)) for i in range(n)]
            await asyncio.sleep(0)      # every task has sent its Generate
            sent.set()
            return await asyncio.gather(*tasks)
    return asyncio.run(run())


def run_in_thread(fn, *args):
    out = {}
    t = threading.Thread(target=lambda: out.update(r=fn(*args)))
    t.start()
    return t, out


def logged_finishes(path) -> list:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT finish_reason FROM requests")]
    finally:
        conn.close()


def wait_tokens(address: str, pred, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with Client(address, timeout=30) as c:
        while not pred(c.stats()):
            assert time.monotonic() < deadline
            time.sleep(0.05)


def check_worker_stall(tmp_path, n: int) -> None:
    g = start_group(tmp_path, ["--step-timeout", "4", *CAPS])
    try:
        with Client(g.address, timeout=30) as c:
            worker = c.stats()["pids"]["worker"]
        def long_request():
            with Client(g.address, timeout=300) as c:
                # long enough to be seen running: 60 tokens took 61 ms on tiny, and the
                # 50 ms poll below missed it (a flake)
                return c.generate([1, 2, 3], max_tokens=2000, ignore_eos=True)
        long_t, long_out = run_in_thread(long_request)
        wait_tokens(g.address, lambda st: st["running"] >= 1 and st["steps"] > 2)
        os.kill(worker, signal.SIGSTOP)     # a step is in flight: the core waits on it
        sent = threading.Event()
        t, out = run_in_thread(send_all, g.address, n, 2, sent)
        t.join(600)
        long_t.join(60)
        assert not t.is_alive()
        assert out["r"] == ["length"] * n, {x: out["r"].count(x) for x in set(out["r"])}
        assert long_out["r"].finish_reason == "length"
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = g.stop()
    assert code == 0, g.tail()
    assert logged_finishes(g.log).count("length") == n + 1
    r = verify_log(g.log)
    assert r.returncode == 0, r.stdout + r.stderr


def check_frontend_stall(tmp_path, n: int) -> None:
    g = start_group(tmp_path, CAPS)
    try:
        with Client(g.address, timeout=30) as c:
            frontend = c.stats()["pids"]["frontend"]
        sent = threading.Event()
        t, out = run_in_thread(send_all, g.address, n, 8, sent)
        assert sent.wait(60)
        wait_tokens(g.address, lambda st: st["running"] > 0)
        os.kill(frontend, signal.SIGSTOP)
        time.sleep(5)   # the point: the frontend stopped a few seconds
        os.kill(frontend, signal.SIGCONT)
        t.join(600)
        assert not t.is_alive()
        assert out["r"] == ["length"] * n, {x: out["r"].count(x) for x in set(out["r"])}
    finally:
        os.kill(frontend, signal.SIGCONT)
        code = g.stop()
    assert code == 0, g.tail()
    assert logged_finishes(g.log).count("length") == n


@pytest.mark.slow
def test_worker_stopped_with_5000_queued(tmp_path):
    check_worker_stall(tmp_path, 5000)


@pytest.mark.slow
def test_frontend_stopped_5s_with_3000_in_flight(tmp_path):
    check_frontend_stall(tmp_path, 3000)
