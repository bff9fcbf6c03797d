"""FrontendWatch: a local frontend's death is seen once, within CHECK_S; a joined core's
frontend (another machine's pid) is never judged by pid."""
from __future__ import annotations

import subprocess
import time

from core.frontend_watch import CHECK_S, FrontendWatch


def dead_within(watch: FrontendWatch, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = watch.died()
        if pid is not None:
            return pid
        time.sleep(0.01)
    return None


def test_a_dead_local_frontend_is_reported_once_and_a_new_one_is_greeted():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        watch = FrontendWatch(local=True)
        assert watch.died() is None            # nobody greeted yet
        assert watch.greet(proc.pid, 0) and not watch.greet(proc.pid, 0)
        assert watch.greet(proc.pid, 1)          # a new epoch from the same frontend
        assert dead_within(watch, 3 * CHECK_S) is None
        proc.kill()                            # not reaped yet: a zombie is dead too
        t0 = time.monotonic()
        assert dead_within(watch, 5 * CHECK_S) == proc.pid
        assert time.monotonic() - t0 <= 5 * CHECK_S
        assert dead_within(watch, 3 * CHECK_S) is None   # once
        assert watch.greet(proc.pid + 1, 1)
    finally:
        proc.kill()
        proc.wait()


def test_a_joined_cores_frontend_is_not_judged_by_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    watch = FrontendWatch(local=False)
    watch.greet(proc.pid, 0)
    assert dead_within(watch, 3 * CHECK_S) is None
