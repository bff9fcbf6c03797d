"""StepPulse: while a step runs, a thread tells the core every PULSE_S that the step is
still computing, so that the core's `--step-timeout` bounds a step's silence, not its
length. Before it, a 3B model's step of 2,048 prompt tokens (over a minute on 2 cores) was
killed as hung, every time it was retried, until serve gave up on the worker.

Progress is the main thread's CPU time. A step that computes advances it (the main thread
is one of the GEMM's OpenMP threads, and runs the model's Python); a worker that is stopped
(SIGSTOP) sends nothing at all, and one that is deadlocked (waiting on a lock, or on a
tensor-parallel peer that hangs) adds none, so either is still replaced after the timeout.
A pulse goes out on a socket of its own (a zmq socket is one thread's), like GrammarReady.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from core.ipc.protocol import StepAlive

PULSE_S = 0.5   # a pulse at most this often; the core's timeout is seconds to minutes


class StepPulse:
    def __init__(self, connect: Callable[[], object], pid: int, period: float | None = None):
        """Made on the thread that runs the steps (its CPU clock is the one read);
        `connect()`: a new channel to the core, made and used on the pulse thread only;
        `period`: PULSE_S unless given."""
        self.pid, self._connect, self._period = pid, connect, period or PULSE_S
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        self._step: int | None = None   # the step running now; None between steps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-pulse", daemon=True)
        self._thread.start()

    def begin(self, step: int) -> None:
        self._step = step

    def end(self) -> None:
        self._step = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _cpu_s(self) -> float:
        return time.clock_gettime(self._clock)

    def _run(self) -> None:
        out = self._connect()
        try:
            last = self._cpu_s()
            while not self._stop.wait(self._period):
                step, now = self._step, self._cpu_s()
                if step is not None and now > last:
                    out.send(StepAlive(step=step, pid=self.pid))
                last = now
        finally:
            out.close()
