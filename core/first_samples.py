"""Which sample rows of a step are their request's first since it was admitted or recomputed:
the rows whose batch brings the request's constraint spec (docs/structured.md, "A
constraint's path").

A prefill's last chunk is one. So is a decode that follows a prefill chunk ending one token
short of the sequence's end: the scheduler queries a request one token from computed as a
decode (core/sched.py, `_decode_phase`), and in the batch's layout that row is the same as
any decode. A prompt of 65 tokens in chunks of 64 takes this path, as does a recompute of that
length. So the engine keeps, between steps, the requests whose last chunk stopped short.
"""
from __future__ import annotations

from typing import Callable

from core.sched_types import RequestId, ScheduleOutput


class FirstSamples:
    def __init__(self):
        self._short: set[RequestId] = set()   # last seen in a chunk that stopped short

    def of(self, out: ScheduleOutput, known: Callable[[RequestId], object]) -> list[bool]:
        """Per sample row of build_batch(out) (its decodes, then its last chunks): whether it
        is its request's first sample since (re)admission. `known(id)` is None once the
        request has finished (one aborted mid-prefill is forgotten then)."""
        short = self._short
        first = [i in short for i in out.decode]
        short.difference_update(out.decode)
        for ch in out.prefill:
            if ch.last:
                short.discard(ch.id)
            else:
                short.add(ch.id)
        if short:
            self._short = {i for i in short if known(i) is not None}
        return first + [True for ch in out.prefill if ch.last]
