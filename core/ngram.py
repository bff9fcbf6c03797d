"""The n-gram proposer (prompt lookup, docs/DESIGN.md "Speculative decoding"): the drafts
for a request are the tokens that followed the latest earlier occurrence of its last n
tokens, in its prompt and output so far, n from MAX_N down to 1.

A pure function of the token list: replay proposes the same drafts from the same tokens.
"""
from __future__ import annotations

from typing import Sequence

MAX_N = 3


def propose(tokens: Sequence[int], k: int, max_n: int = MAX_N) -> list[int]:
    """Up to k drafts to follow `tokens`: the longest suffix (n <= max_n) that occurred
    before wins, and among its occurrences the latest one (the nearest context); [] when
    no suffix of one token or more occurred before, or k < 1."""
    size = len(tokens)
    if k < 1:
        return []
    for n in range(min(max_n, size - 1), 0, -1):
        tail = list(tokens[size - n:])
        last = tail[-1]
        # a match ends at i < size - 1, so at least one token follows it
        for i in range(size - 2, n - 2, -1):
            if tokens[i] == last and list(tokens[i - n + 1:i + 1]) == tail:
                return list(tokens[i + 1:i + 1 + k])
    return []
