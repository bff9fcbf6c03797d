"""One stop string's Knuth-Morris-Pratt automaton, fed text piece by piece.

`state` is the length of the longest suffix of all text fed so far that is a proper
prefix of the pattern: what the stop matcher must hold back for this stop. Feeding n
characters costs O(n) amortized (state rises by at most one per character and every
fallback lowers it), whatever the pattern's length.
"""
from __future__ import annotations


def borders(pattern: str) -> list[int]:
    """borders[i]: the length of the longest proper border of pattern[:i + 1]."""
    out = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = out[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        out[i] = k
    return out


class PrefixAutomaton:
    def __init__(self, pattern: str):
        if not pattern:
            raise ValueError("the pattern must not be empty")
        self.pattern = pattern
        self._borders = borders(pattern)
        self.state = 0

    def feed(self, text: str) -> int | None:
        """Advance over `text`; the index in `text` just past the first occurrence of the
        pattern that ends in it, or None."""
        p, b, n, k = self.pattern, self._borders, len(self.pattern), self.state
        first = None
        for i, c in enumerate(text):
            while k and p[k] != c:
                k = b[k - 1]
            if p[k] == c:
                k += 1
                if k == n:
                    if first is None:
                        first = i + 1
                    k = b[k - 1]
        self.state = k
        return first
