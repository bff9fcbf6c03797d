"""Stop strings: cut a request's output before the first stop string.

"First" means the earliest start in the whole output, whatever the token boundaries: a
stop that completes may still lose to a longer one that started earlier and is not
complete yet, so text from the earliest possible start of a stop (a suffix that is a proper
prefix of one) is held back until later text decides it. Invariant: released text never
contains the start of a stop occurrence, so searching `held + new` finds every candidate.
"""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Feed text as it is generated; `matched` turns True at the first stop string."""

    def __init__(self, stops: Sequence[str] = ()):
        self._stops = tuple(stops)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched = False

    def feed(self, text: str, final: bool = False) -> str:
        """The part of held + `text` that is certainly output. `final`: the output ends
        here, so nothing is held back any more."""
        if self.matched:
            return ""
        buf = self._held + text
        cut = self._first_match(buf)
        pending = len(buf) if final else len(buf) - self._partial_suffix(buf)
        if cut is not None and cut <= pending:
            self.matched, self._held = True, ""
            return buf[:cut]
        self._held = buf[pending:]
        return buf[:pending]

    def _first_match(self, buf: str) -> int | None:
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        return min(hits, default=None)

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop."""
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[len(buf) - k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
