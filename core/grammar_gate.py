"""The core's grammar gate: a constrained request enters the scheduler only once its
worker holds its grammar (docs/structured.md, "Built before the step").

A request whose constraint the worker is not known to hold waits here, outside the engine:
the core sends the worker PrepareGrammar (once per key), the worker builds the grammar on a
thread of its own and answers GrammarReady, and the core then adds every request that waited
for that key. Nothing waiting here is in a step, so a slow build stalls no other request,
and the step log records the add when it happens: replay needs nothing new. Requests
without a constraint, or whose key the worker holds, pass at once.

The gate's view of what the worker holds is the keys it reported, at most MAX_READY (the
worker keeps MAX_GRAMMARS, twice as many, most recently used first), and is emptied when a
new worker takes over. Where the view is stale (a key evicted in the worker meanwhile), the
worker builds the key in the step that needs it, as before: slower, never wrong.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.ipc.protocol import AddRequest, GrammarReady, PrepareGrammar

MAX_READY = 512


@dataclass
class Parked:
    msg: AddRequest
    received: float | None   # the wall clock when the core read it (logged at its add)


class GrammarGate:
    def __init__(self, size: int = MAX_READY):
        self.size = size
        self.worker_pid = 0   # GrammarReady from any other worker is stale
        self._ready: OrderedDict[str, None] = OrderedDict()
        self._waiting: dict[str, list[Parked]] = {}   # key -> requests; [] if none is left
        self._specs: dict[str, PrepareGrammar] = {}   # what was asked for each waiting key

    def __len__(self) -> int:
        return sum(len(v) for v in self._waiting.values())

    def admit(self, msg: AddRequest, received: float | None) -> tuple[bool, PrepareGrammar | None]:
        """(whether `msg` goes to the engine now, the PrepareGrammar to send the worker).
        A request that does not go now waits here until its key's GrammarReady."""
        c = msg.sampling.constraint
        if c is None:
            return True, None
        if c.key in self._ready:
            self._ready.move_to_end(c.key)
            return True, None
        new = c.key not in self._waiting
        self._waiting.setdefault(c.key, []).append(Parked(msg, received))
        if not new:
            return False, None
        self._specs[c.key] = PrepareGrammar(c.key, c.kind, c.text)
        return False, self._specs[c.key]

    def ready(self, msg: GrammarReady) -> list[Parked]:
        """The requests that waited for `msg.key`, in their order (none if stale)."""
        if msg.pid != self.worker_pid:
            return []
        self._ready[msg.key] = None
        self._ready.move_to_end(msg.key)
        while len(self._ready) > self.size:
            self._ready.popitem(last=False)
        self._specs.pop(msg.key, None)
        return self._waiting.pop(msg.key, [])

    def forget(self, fid: int) -> bool:
        """Drop the waiting request `fid` (aborted, or sent again); whether it waited. Its
        key's build goes on: the grammar is held when it is done."""
        for parked in self._waiting.values():
            for p in parked:
                if p.msg.fid == fid:
                    parked.remove(p)
                    return True
        return False

    def drop_all(self) -> list[Parked]:
        """Every waiting request, forgotten (their builds go on)."""
        out = [p for parked in self._waiting.values() for p in parked]
        for parked in self._waiting.values():
            parked.clear()
        return out

    def new_worker(self, pid: int, live: list) -> list[PrepareGrammar]:
        """A new worker `pid` holds nothing: what to ask it for, the keys of requests waiting
        here and of `live` (the engine's constraints, whose recompute would otherwise build
        them in a step; those requests are in the scheduler already and may reach a step
        before the build ends: the worker then waits for that build)."""
        self.worker_pid = pid
        self._ready.clear()
        asks = dict(self._specs)
        for c in live:
            asks.setdefault(c.key, PrepareGrammar(c.key, c.kind, c.text))
        return list(asks.values())
