"""A thread's own CPU priority: background work (a grammar build in the worker, a constraint's
compile check in the frontend) runs niced, so it takes the cores the serving threads leave
idle instead of stalling a step's threads. Linux keeps a niceness per thread; elsewhere the
call does nothing."""
from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 10   # about a tenth of a busy core's time against a thread at niceness 0


def lower_this_thread(by: int = BACKGROUND_NICE) -> None:
    """The calling thread's niceness up by `by` (it cannot come down again unprivileged)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + by)
    except (OSError, AttributeError):
        pass


def niceness_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
