"""A thread's own CPU priority: background work (a grammar build in the worker, a constraint's
compile check in the frontend's compile process) runs as the scheduler's background, so it
takes the cores the serving threads leave idle instead of stalling a step's threads.

Niceness alone is not enough (docs/structured.md, "Built before the step"): Linux's EEVDF
scheduler lets a task that has a core run out its time slice before a waking task of higher
weight takes the core, so a step's OpenMP thread that wakes beside a niced build waited up to
a tick: a one-row step on `tiny` took 4.1 ms instead of 0.7 ms through a compile flood. A
SCHED_IDLE task gives way at once to any waking normal one (the flood's steps over 3 ms went
from 43-170 to 7-48 of ~1,000). Linux keeps both per thread; elsewhere the calls do nothing.
"""
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


def make_this_thread_background() -> None:
    """The calling thread niced (BACKGROUND_NICE) and SCHED_IDLE (it cannot be undone
    unprivileged): it runs where no normal thread wants a core."""
    lower_this_thread()
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))   # 0: the calling thread
    except (OSError, AttributeError):
        pass


def is_background(tid: int | None = None) -> bool:
    """Whether thread `tid` (the calling one by default) is SCHED_IDLE."""
    try:
        return os.sched_getscheduler(tid or threading.get_native_id()) == os.SCHED_IDLE
    except (OSError, AttributeError):
        return False


def niceness_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
