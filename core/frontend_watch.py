"""FrontendWatch: which frontend the core answers to, and whether it still lives.

The core learns its frontend's pid, and the epoch it is greeted in, from `Hello`: a new
pid or epoch means the requests held are nobody's (core/ipc/protocol.py, Hello). A local frontend's pid is checked every
CHECK_S: one that died leaves requests nobody will read, and serve takes seconds to start
its successor (whose `Hello` would abort them too), time the engine would spend on them. A
joined core's frontend is on another machine, where its pid names nothing: there only the
next `Hello` speaks for it.
"""
from __future__ import annotations

import time

from core.ipc.lifeline import pid_alive

CHECK_S = 0.1   # as often as the worker's pid during a step


class FrontendWatch:
    def __init__(self, local: bool):
        self.local = local
        self.pid: int | None = None
        self.epoch = 0     # the last Hello's, echoed in CoreReady
        self._next_check = 0.0

    def greet(self, pid: int, epoch: int) -> bool:
        """`Hello` from `pid` in `epoch`; True unless it repeats the last greeting."""
        new = (pid, epoch) != (self.pid, self.epoch)
        self.pid, self.epoch = pid, epoch
        return new

    def died(self) -> int | None:
        """The pid of the local frontend that greeted last, once, when it is found dead."""
        now = time.monotonic()
        if not self.local or self.pid is None or now < self._next_check:
            return None
        self._next_check = now + CHECK_S
        if pid_alive(self.pid):
            return None
        dead, self.pid = self.pid, None
        return dead
