"""The worker's grammar builds off the step path (docs/structured.md, "Built before the
step"): the core sends PrepareGrammar for a constraint it has not seen this worker hold, and
holds the requests under it; this thread builds the grammar into the runner's Grammars and
answers GrammarReady on a socket of its own (a zmq socket is one thread's), so the steps of
every other request go on meanwhile.

The thread runs as the scheduler's background (SCHED_IDLE and niced: core/thread_nice.py;
Linux sets both per thread): a build waits for the cores the steps leave idle rather than
slowing every stream. llguidance lets go of the GIL while it builds, so the step's Python does
not wait for it either (a background thread preempted while it held the GIL would hold up the
step until a core fell idle: the frontend's compiles, which hold it longer, run in a process
of their own, frontend/compile_process.py). It also
computes the first mask of a copy for the key's first sequence (Grammars.warmed): that mask
explores the grammar's lexer states, a cost as large as a build's for some schemas.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from core.ipc.protocol import Constraint, GrammarReady, PrepareGrammar
from core.thread_nice import make_this_thread_background

log = logging.getLogger("worker")


class GrammarBuilds:
    def __init__(self, grammars, connect: Callable[[], object], pid: int):
        """`grammars`: worker/grammar.py's Grammars; `connect()`: a new channel to the core
        (made and used on the thread only)."""
        self.grammars, self._connect, self.pid = grammars, connect, pid
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="grammars", daemon=True)
        self._thread.start()

    def prepare(self, msg: PrepareGrammar) -> bool:
        """Queue `msg`'s build; False when the worker holds it or builds it already (the
        caller answers a held key at once; one being built is answered when built)."""
        if not self.grammars.begin(msg.key):
            return False
        self._queue.put((msg.key, Constraint(msg.kind, msg.text)))
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        make_this_thread_background()
        out = self._connect()
        try:
            while (job := self._queue.get()) is not None:
                key, c = job
                try:
                    built = self.grammars.build(c)
                    self.grammars.install(key, built, self.grammars.warmed(built))
                except Exception:  # noqa: BLE001  a bug must not leave its requests waiting
                    log.exception("building constraint %s failed", key)
                    self.grammars.abandon(key)   # the step that needs it tries again
                out.send(GrammarReady(key=key, pid=self.pid))
        finally:
            out.close()

