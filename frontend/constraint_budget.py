"""How many new constraints one client may have compiled: a token bucket per client
(docs/structured.md, "The compile budget").

A constraint the frontend has a verdict for (frontend/compile_check.py) costs nothing; each
new one takes a token from its client's bucket, which refills at `per_s` tokens a second up
to `burst`. A client whose bucket is empty gets 429 for a new constraint, and its cached ones
still pass. The client is the identity the tokenizing thread's fair queue uses: the ZMQ
routing id (over HTTP, the gateway's engine client, which carries several users;
docs/structured.md, "The compile budget"). The frontend's compile thread takes from it (and
its tokenizing thread, for a verdict evicted meanwhile): `take` holds a lock.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from frontend.validate import InvalidField

DEFAULT_NEW_CONSTRAINTS_PER_S = 8.0
BURST_S = 8.0     # the bucket holds this many seconds' refill: 64 new schemas at once by default
PRUNE_FROM = 1024   # buckets kept before the full ones (which a new client's equals) go


class OverBudget(InvalidField):
    """A new constraint past its client's budget: 429 naming the field."""
    code = 429


class ConstraintBudget:
    def __init__(self, per_s: float = DEFAULT_NEW_CONSTRAINTS_PER_S, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.per_s, self.clock = per_s, clock
        self.burst = burst if burst is not None else max(1.0, per_s * BURST_S)
        self._buckets: dict[bytes, tuple[float, float]] = {}   # ident -> (tokens, read at)
        self._prune_at = PRUNE_FROM
        self._lock = threading.Lock()

    def take(self, ident: bytes) -> bool:
        """One new constraint for `ident`: whether its bucket had a token (then spent)."""
        with self._lock:
            return self._take(ident)

    def _take(self, ident: bytes) -> bool:
        now = self.clock()
        tokens = self._tokens(ident, now)
        ok = tokens >= 1
        self._buckets[ident] = (tokens - 1 if ok else tokens, now)
        if len(self._buckets) > self._prune_at:
            self._prune(now)
        return ok

    def refusal(self, field: str) -> OverBudget:
        return OverBudget(f"{field}: this client asked for more new constraints than its budget"
                          f" of {self.per_s:g} a second ({self.burst:g} at once;"
                          " --new-constraints-per-s); constraints compiled before are free",
                          field)

    def _tokens(self, ident: bytes, now: float) -> float:
        tokens, at = self._buckets.get(ident, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - at) * self.per_s)

    def _prune(self, now: float) -> None:
        """Forget the full buckets: a client without one starts full."""
        for ident in [i for i in self._buckets if self._tokens(i, now) >= self.burst]:
            del self._buckets[ident]
        self._prune_at = max(PRUNE_FROM, 2 * len(self._buckets))
