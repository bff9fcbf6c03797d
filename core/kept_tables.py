"""The int32 bytes of each running request's block table, kept between steps.

Every step puts every running request's whole block table into the ForwardBatch. At 256
requests of ~120 blocks that is ~30,000 ints converted a step, a sixth of the core's step
loop; kept here, a step converts only the blocks added since the last.

Valid because of how core/blocks.py and core/prefix_cache.py keep tables: a live table is
one list that only grows by appending, and a new allocation is a new list. So the same list
object, as long as before, holds the same blocks, and a longer one holds them followed by
new ones. An entry keeps its list alive, so `is` cannot match a new list at a recycled
address. tests/core/test_batch.py checks the bytes against a conversion from scratch over
traffic that preempts, frees and grows tables.
"""
from __future__ import annotations

from typing import Hashable, Sequence

from core.ipc.protocol import I32


class KeptTables:
    def __init__(self):
        # request -> (its table list, the length converted, those blocks as int32 bytes)
        self._seen: dict[Hashable, tuple[list, int, bytes]] = {}

    def padded(self, seq_ids: Sequence[Hashable], tables: Sequence[Sequence[int]],
               width: int) -> I32:
        """The tables one after another, each padded with 0 to `width` blocks."""
        self._forget_finished(seq_ids)
        seen, pieces = self._seen, []
        for s, t in zip(seq_ids, tables):
            entry = seen.get(s)
            start = appended_from(entry, t)
            if start is not None:
                kept = entry[2] if start else b""
                entry = seen[s] = (t, len(t), kept + I32(t[start:]).tobytes())
            pieces.append(entry[2])
            if len(t) < width:
                pieces.append(bytes(4 * (width - len(t))))
        return I32(b"".join(pieces))

    def _forget_finished(self, seq_ids: Sequence[Hashable]) -> None:
        """Keep only this batch's entries once the others are the many: a running request
        left out of a few batches converts its table again, no more."""
        if len(self._seen) > 2 * len(seq_ids) + 256:
            self._seen = {s: self._seen[s] for s in seq_ids if s in self._seen}


def appended_from(entry: tuple | None, table: Sequence[int]) -> int | None:
    """Where the blocks of `table` that `entry` (the table list and its length when last
    seen, then anything) does not hold begin: None when it is the same list at the same
    length, the old length when the same list grew, 0 for another list (all new)."""
    if entry is not None and entry[0] is table:
        if entry[1] == len(table):
            return None
        if entry[1] < len(table):
            return entry[1]
    return 0
