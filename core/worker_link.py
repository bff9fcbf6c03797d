"""WorkerLink: the core's two sockets to its worker, and whether that worker lives.

A step's ForwardBatch goes out on a bound PUSH; its StepResult (and a new worker's
WorkerReady) comes back on a bound PULL. While the core waits for a result, the link also
polls the frontend's socket and calls back (the core queues those inputs for after the
step), checks the worker's pid every WORKER_CHECK_S and kills a worker past the step
timeout: a dead or hung worker is WorkerDied, never a core stuck waiting.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable

import zmq

from core.ipc.channel import Channel
from core.ipc.lifeline import pid_alive
from core.ipc.protocol import ProtocolError, StepResult, WorkerReady

WORKER_CHECK_S = 0.1     # how often the worker's pid is checked while a step runs


class WorkerLost(Exception):
    """No worker came back after one died (serve gave up on restarting it)."""


class WorkerDied(Exception):
    """The worker died, or hung past the step timeout (and was killed), mid-step."""


class WorkerLink:
    def __init__(self, ctx: zmq.Context, worker_in: str, worker_out: str,
                 frontend_sock: zmq.Socket, step_timeout: float):
        self.wk_in = Channel(ctx, zmq.PULL, worker_in, bind=True,
                             accept=(WorkerReady, StepResult), max_bytes=1 << 30)
        self.wk_out = Channel(ctx, zmq.PUSH, worker_out, bind=True, max_bytes=1 << 30)
        self.step_timeout = step_timeout
        self.pid = 0
        self._frontend = frontend_sock
        self._poll = zmq.Poller()   # a step waits on the worker and reads the frontend
        self._poll.register(self.wk_in.sock, zmq.POLLIN)
        self._poll.register(frontend_sock, zmq.POLLIN)
        self._ready_pending: WorkerReady | None = None

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def wait_ready(self, timeout: float | None, meanwhile: Callable[[], None]) -> WorkerReady:
        """The next WorkerReady (`meanwhile` runs between polls); WorkerLost past `timeout`."""
        if self._ready_pending is not None:
            msg, self._ready_pending = self._ready_pending, None
            return msg
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            meanwhile()
            if not self.wk_in.poll(100):
                continue
            try:
                msg = self.wk_in.recv()
            except ProtocolError as e:
                _log(f"dropped a bad frame from the worker: {e}")
                continue
            if isinstance(msg, WorkerReady):
                return msg
        raise WorkerLost(f"no worker came back within {timeout:.0f}s")

    def send(self, batch) -> None:
        self.wk_out.send(batch)

    def result(self, step: int, rows: int,
               meanwhile: Callable[[bool], None]) -> StepResult:
        """The worker's result for `step` (`rows` tokens); WorkerDied if it dies or hangs.
        `meanwhile(frontend_readable)` runs after every poll."""
        deadline = time.monotonic() + self.step_timeout
        while True:
            ready = dict(self._poll.poll(int(WORKER_CHECK_S * 1000)))
            meanwhile(self._frontend in ready)
            if self.wk_in.sock in ready:
                msg = self.wk_in.recv()
                if isinstance(msg, StepResult) and msg.step == step:
                    if len(msg.tokens) != rows:
                        raise WorkerDied(f"bad result for step {step}")
                    return msg
                if isinstance(msg, WorkerReady):  # a new worker: the old one is gone
                    self._ready_pending = msg
                    raise WorkerDied("a new worker announced itself")
            if not self.alive():
                raise WorkerDied(f"it exited during step {step}")
            if time.monotonic() > deadline:
                self._kill()
                raise WorkerDied(f"step {step} took over {self.step_timeout}s")

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for ch in (self.wk_in, self.wk_out):
            ch.close()


def _log(msg: str) -> None:
    print(f"[core] {msg}", file=sys.stderr, flush=True)
