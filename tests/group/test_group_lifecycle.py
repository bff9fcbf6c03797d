"""Start, drain and death of a process group: nothing left behind."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from frontend.client import Client, ClientError
from scripts.group.harness import start_group
from tests.waiting import poll, wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids, timeout: float = 10.0) -> bool:
    return bool(poll(lambda: not any(alive(p) for p in pids), timeout))


def test_sigterm_drains_running_requests_then_stops_everything(tmp_path):
    g = start_group(tmp_path, ["--drain-timeout", "20"])
    result = {}
    try:
        with Client(g.address, timeout=30) as c:
            pids = list(c.stats()["pids"].values())

        def long_request():
            with Client(g.address, timeout=30) as c2:
                result["r"] = c2.generate([1, 2, 3], max_tokens=150, ignore_eos=True)
        t = threading.Thread(target=long_request)
        t.start()
        with Client(g.address, timeout=30) as c:
            wait_until(lambda: c.stats()["running"] == 1, what="the long request to run")
        g.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining:" in g.stderr.read_text(), what="the frontend to drain")
        with Client(g.address, timeout=5) as c:
            with pytest.raises(ClientError) as e:
                c.generate("late", max_tokens=2)
            assert e.value.code == 503
        t.join(60)
        assert g.proc.wait(60) == 0
    finally:
        g.stop()
    assert result["r"].finish_reason == "length" and len(result["r"].token_ids) == 150
    assert wait_dead(pids)


@pytest.mark.slow  # keeps the default suite under 5 minutes; CI runs it
@pytest.mark.parametrize("victim, args", [("core", []), ("frontend", ["--max-restarts", "0"])])
def test_a_dead_process_stops_the_group_non_zero(tmp_path, victim, args):
    """The core is never restarted; a frontend is, until its restarts run out."""
    g = start_group(tmp_path, args, log=False)
    try:
        with Client(g.address, timeout=30) as c:
            pids = c.stats()["pids"]
        t0 = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        code = g.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        g.stop()
    assert code != 0
    assert took < 10, took  # 5x the 2 s target
    assert f"{victim} exited" in g.tail()
    assert wait_dead(pids.values())


def stuck_gateway_group(tmp_path, drain: str):
    """A group with a gateway that cannot act on SIGTERM (stopped, as one stuck in its loop
    is to a signal handler); its children's pids."""
    g = start_group(tmp_path, ["--model", "null", "--http-port", "0", "--drain-timeout", drain],
                    log=False)
    pids = g.pids()
    assert len(pids) >= 4, pids   # worker, core, frontend, gateway
    os.kill(g.pid_of("-m frontend.http"), signal.SIGSTOP)
    return g, pids


@pytest.mark.slow  # waits out the gateway's 11 s grace
def test_a_stuck_gateway_is_killed_after_the_grace_and_nothing_is_left(tmp_path):
    g, pids = stuck_gateway_group(tmp_path, "1")   # the gateway's grace: 1 + 10 s
    try:
        g.proc.send_signal(signal.SIGTERM)
        code = g.proc.wait(55)   # 5x the grace
    finally:
        g.stop(signal.SIGKILL)
    assert code == 0, g.tail()
    assert wait_dead(pids) and not g.pids()


def test_a_second_signal_kills_at_once(tmp_path):
    g, pids = stuck_gateway_group(tmp_path, "30")   # a 40 s grace the second signal skips
    try:
        g.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "serve: draining" in g.stderr.read_text(), what="serve to stop")
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGINT)
        g.proc.wait(40)
        took = time.monotonic() - t0
    finally:
        g.stop(signal.SIGKILL)
    assert took < 20, took
    assert wait_dead(pids) and not g.pids()


def test_serve_killed_leaves_no_orphan(tmp_path):
    """PR_SET_PDEATHSIG SIGKILL in every child (core/ipc/lifeline.py; a stuck one included:
    tests/core/test_lifeline.py)."""
    g = start_group(tmp_path, ["--model", "null", "--http-port", "0"], log=False)
    pids = g.pids()
    g.proc.kill()
    g.proc.wait()
    try:
        assert len(pids) >= 4 and wait_dead(pids), [p for p in pids if alive(p)]
    finally:
        for p in g.pids():   # a failed test leaves nothing behind either
            os.kill(p, signal.SIGKILL)
