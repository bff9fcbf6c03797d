"""Stop strings: cut a request's output before the first stop string.

"First" means the earliest start in the whole output, whatever the token boundaries: a
stop that completes may still lose to a longer one that started earlier and is not
complete yet, so text from the earliest possible start of a stop (a suffix that is a proper
prefix of one) is held back until later text decides it. Invariant: released text never
contains the start of a stop occurrence.

Each stop has its own automaton (frontend/prefix_automaton.py) fed only the new text, so
a feed costs O(stops x new text) amortized, not O(stops x their length).
"""
from __future__ import annotations

from typing import Sequence

from frontend.prefix_automaton import PrefixAutomaton


class StopMatcher:
    """Feed text as it is generated; `matched` turns True at the first stop string."""

    def __init__(self, stops: Sequence[str] = (), include: bool = False):
        self._automata = [PrefixAutomaton(s) for s in dict.fromkeys(stops) if s]
        self._include = include       # the released text ends with the stop string itself
        self._held = ""
        self._fed = 0                 # characters fed so far
        # The start (in all text fed) of the earliest complete stop; an empty stop is
        # complete before any text.
        self._cut: int | None = 0 if "" in stops else None
        self._cut_len = 0             # the length of the stop string starting at _cut
        self.matched = False
        # no stop strings: nothing is ever held back or cut (the common case, per delta)
        self._none = not self._automata and self._cut is None

    def feed(self, text: str, final: bool = False) -> str:
        """The part of held + `text` that is certainly output. `final`: the output ends
        here, so nothing is held back any more."""
        if self._none:
            return text
        if self.matched:
            return ""
        self._advance(text)
        buf = self._held + text
        start = self._fed - len(buf)  # where buf begins in all text fed
        pending = len(buf) if final else len(buf) - self._longest_partial()
        if self._cut is not None and self._cut - start <= pending:
            self.matched, self._held = True, ""
            return buf[:self._cut - start + (self._cut_len if self._include else 0)]
        self._held = buf[pending:]
        return buf[:pending]

    def _advance(self, text: str) -> None:
        for a in self._automata:
            end = a.feed(text)
            if end is not None:
                begin = self._fed + end - len(a.pattern)
                if self._cut is None or begin < self._cut:
                    self._cut, self._cut_len = begin, len(a.pattern)
        self._fed += len(text)

    def _longest_partial(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop."""
        return max((a.state for a in self._automata), default=0)
