"""serve's stop of one child (scripts/group/procs.py Children.stop): SIGTERM, then SIGKILL
after the grace period or at once when hurried, whatever the child is doing."""
from __future__ import annotations

import sys
import time

import pytest

from core.ipc.lifeline import pid_alive
from scripts.group.procs import Children

# a child stuck in a busy loop that ignores SIGTERM (as a gateway blocked in a template did)
STUCK = ("import signal\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('READY stuck', flush=True)\n"
         "while True:\n"
         "    pass\n")


@pytest.fixture()
def stuck():
    group = Children({"http": [sys.executable, "-c", STUCK]}, piped=("http",))
    try:
        assert group.wait_ready(30, "http") == "stuck"
        yield group
    finally:
        for p in group.procs.values():   # whatever the test left
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(stuck):
    pid = stuck.procs["http"].pid
    t0 = time.monotonic()
    stuck.stop(["http"], grace=1.0)
    took = time.monotonic() - t0
    assert stuck.procs["http"].returncode == -9 and not pid_alive(pid)
    assert 1.0 <= took < 5.0, took   # the grace, then the kill (5x its 1 s target)


def test_a_hurried_stop_kills_at_once(stuck):
    stuck.hurried = lambda: True   # serve's second SIGTERM/SIGINT
    t0 = time.monotonic()
    stuck.stop(["http"], grace=600.0)
    assert stuck.procs["http"].returncode == -9
    assert time.monotonic() - t0 < 30, "waited out the grace"
