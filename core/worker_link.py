"""WorkerLink: the core's two sockets to its worker, and whether that worker lives.

A step's ForwardBatch (and PrepareGrammar) goes out on a bound PUSH; its StepResult (and a
new worker's WorkerReady, GrammarReady whenever a grammar is built, and StepAlive while a
long step computes) comes back on a bound PULL; GrammarReady goes to `on_news` whenever it
is read. While the core waits for a result, the link also polls the frontend's socket and
calls back (the core queues those inputs for after the step), checks the worker's pid every
WORKER_CHECK_S and kills a worker silent for the step timeout (no result and no StepAlive):
a dead or hung worker is WorkerDied, never a core stuck waiting; a slow step is not hung.
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
from core.ipc.protocol import GrammarReady, ProtocolError, StepAlive, StepResult, WorkerReady

WORKER_CHECK_S = 0.1     # how often the worker's pid is checked while a step runs


class WorkerLost(Exception):
    """No worker came back after one died (serve gave up on restarting it)."""


class WorkerDied(Exception):
    """The worker died, or hung past the step timeout (and was killed), mid-step."""


class WorkerLink:
    def __init__(self, ctx: zmq.Context, worker_in: str, worker_out: str,
                 frontend_sock: zmq.Socket, step_timeout: float,
                 on_news: Callable[[GrammarReady], None] = lambda msg: None):
        self.wk_in = Channel(ctx, zmq.PULL, worker_in, bind=True,
                             accept=(WorkerReady, StepResult, GrammarReady, StepAlive),
                             max_bytes=1 << 30)
        self.on_news = on_news
        self.wk_out = Channel(ctx, zmq.PUSH, worker_out, bind=True, max_bytes=1 << 30)
        self.step_timeout = step_timeout
        self.pid = 0
        self._frontend = frontend_sock
        self._poll = zmq.Poller()   # a step waits on the worker and reads the frontend
        self._poll.register(self.wk_in.sock, zmq.POLLIN)
        self._poll.register(frontend_sock, zmq.POLLIN)
        self._ready_pending: WorkerReady | None = None
        self._early: dict[int, StepResult] = {}   # results read between steps, by step

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def wait_ready(self, timeout: float | None, meanwhile: Callable[[], None]) -> WorkerReady:
        """The next WorkerReady (`meanwhile` runs between polls); WorkerLost past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            if self._ready_pending is not None:
                msg, self._ready_pending = self._ready_pending, None
                return msg
            meanwhile()
            if self.wk_in.poll(100):
                self._read_news()
        raise WorkerLost(f"no worker came back within {timeout:.0f}s")

    def wait_idle(self, block_ms: int) -> bool:
        """Between steps: wait up to `block_ms` for the frontend or the worker; the worker's
        messages are read (GrammarReady to on_news, a new WorkerReady kept for wait_ready);
        whether the frontend's socket is readable."""
        ready = dict(self._poll.poll(block_ms))
        if self.wk_in.sock in ready:
            self._read_news()
        return self._frontend in ready

    def _read_news(self) -> None:
        """Every message the worker sent outside a step's wait; a StepResult read here (an
        overlapped step's, done while the core was between steps) is kept for result()."""
        while True:
            try:
                msg = self.wk_in.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ProtocolError as e:
                _log(f"dropped a bad frame from the worker: {e}")
                continue
            if isinstance(msg, WorkerReady):
                self._ready_pending = msg
            elif isinstance(msg, GrammarReady):
                self.on_news(msg)
            elif isinstance(msg, StepResult):
                self._early[msg.step] = msg

    def send(self, batch) -> None:
        self.wk_out.send(batch)

    def try_send(self, msg) -> bool:
        """`msg` to the worker unless none is connected (then a new one is asked again)."""
        return self.wk_out.try_send(msg)

    def result(self, step: int, rows: int,
               meanwhile: Callable[[bool], None]) -> StepResult:
        """The worker's result for `step` (`rows` tokens); WorkerDied if it dies, or is
        silent for step_timeout: neither a result nor a StepAlive of this step (a long step
        pulses while it computes: worker/step_pulse.py). `meanwhile(frontend_readable)` runs
        after every poll."""
        deadline = time.monotonic() + self.step_timeout
        early, self._early = self._early.get(step), {}   # any other is an abandoned step's
        if early is not None:
            return self._checked(early, step, rows)
        if self._ready_pending is not None:   # read between steps: the old worker is gone
            raise WorkerDied("a new worker announced itself")
        while True:
            ready = dict(self._poll.poll(int(WORKER_CHECK_S * 1000)))
            meanwhile(self._frontend in ready)
            if self.wk_in.sock in ready:
                msg = self.wk_in.recv()
                if isinstance(msg, StepResult) and msg.step == step:
                    return self._checked(msg, step, rows)
                if isinstance(msg, StepAlive):
                    if msg.step == step and msg.pid == self.pid:
                        deadline = time.monotonic() + self.step_timeout
                elif isinstance(msg, GrammarReady):
                    self.on_news(msg)
                elif isinstance(msg, WorkerReady):  # a new worker: the old one is gone
                    self._ready_pending = msg
                    raise WorkerDied("a new worker announced itself")
            if not self.alive():
                raise WorkerDied(f"it exited during step {step}")
            if time.monotonic() > deadline:
                self._kill()
                raise WorkerDied(f"step {step} was silent for {self.step_timeout}s")

    @staticmethod
    def _checked(msg: StepResult, step: int, rows: int) -> StepResult:
        if len(msg.tokens) != rows:
            raise WorkerDied(f"bad result for step {step}")
        return msg

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
