"""The n-gram proposer (prompt lookup, docs/design/scheduler.md "Speculative decoding"): the drafts
for a request are the tokens that followed the latest earlier occurrence of its last n
tokens, in its prompt and output so far, n from MAX_N down to 1.

A pure function of the token list: replay proposes the same drafts from the same tokens.
The search runs in C (bytes.rfind over the tokens as int32 bytes), not a Python loop: it
scans the whole context of every speculating request every step.
"""
from __future__ import annotations

from array import array
from typing import Sequence

MAX_N = 3


def propose(tokens: Sequence[int], k: int, max_n: int = MAX_N) -> list[int]:
    """k drafts to follow `tokens`: the longest suffix (n <= max_n) that occurred before
    wins, and among its occurrences the latest one (the nearest context); the drafts are
    what followed it (`_continued`). [] when no suffix of one token or more occurred
    before, or k < 1."""
    size = len(tokens)
    if k < 1 or size < 2:
        return []
    data = array("i", tokens)
    w = data.itemsize
    data = data.tobytes()
    for n in range(min(max_n, size - 1), 0, -1):
        tail = data[w * (size - n):]
        end = w * (size - 1)   # a match ends before the last token: one token follows it
        while (at := data.rfind(tail, 0, end)) >= 0:
            if at % w == 0:
                return _continued(tokens, at // w + n, k)
            end = at + len(tail) - 1   # a match across token boundaries: look before it
    return []


def _continued(tokens: Sequence[int], start: int, k: int) -> list[int]:
    """The k tokens from `start` on, where tokens[:start] ends as the whole sequence does:
    a continuation that reaches the end goes on with the period that the match implies
    (len - start), so a run like "z z z" drafts k more of it, not the one token left."""
    period = len(tokens) - start
    return [tokens[start + j % period] for j in range(k)]
