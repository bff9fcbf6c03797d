"""Block tables that only grow: what each running request's table gained since it was last
seen. Two users, one rule (`appended_from`):
- KeptTables: the int32 bytes of each table for the ForwardBatch, kept between steps.
- TableLedger: what the state hash takes of the tables (step log format 3).

KeptTables. Every step puts every running request's whole block table into the ForwardBatch. At 256
requests of ~120 blocks that is ~30,000 ints converted a step, a sixth of the core's step
loop; kept here, a step converts only the blocks added since the last.

Valid because of how core/blocks.py and core/prefix_cache.py keep tables: a live table is
one list that only grows by appending, and a new allocation is a new list. So the same list
object, as long as before, holds the same blocks, and a longer one holds them followed by
new ones. An entry keeps its list alive, so `is` cannot match a new list at a recycled
address. tests/core/test_batch.py checks the bytes against a conversion from scratch over
traffic that preempts, frees and grows tables.

TableLedger. The state hash takes each table's length every step, and each block once, at
the step it joins its table. Format 2 hashed every table whole every step: O(blocks held) per
step, 0.37 of the 0.46 ms its msgpack took at 256 requests of ~95 blocks, and more as
contexts grow. Format 3 is O(running requests) per step, plus the blocks appended since the
last step. The hash chain holds every step's appends, so a table's contents reach every later
hash just as the whole table did. tests/core/test_table_ledger.py rebuilds every table from the
changes over traffic that preempts, frees and grows them.
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


class TableLedger:
    def __init__(self):
        self._seen: dict[Hashable, tuple[Sequence[int], int]] = {}   # seq_id -> (table, length)

    def entries(self, running: Sequence[tuple]) -> tuple[list, list]:
        """For the snapshot's running (seq_id, n, c, table) rows: their (seq_id, n, c,
        table length), and the changes since the last call, (seq_id, first index, blocks
        from it), a table new to the ledger from index 0."""
        seen, now = self._seen, {}
        rows, changes = [], []
        for seq_id, n, c, table in running:
            k = len(table)
            start = appended_from(seen.get(seq_id), table)
            if start is not None and start < k:
                changes.append((seq_id, start, list(table[start:])))
            now[seq_id] = (table, k)
            rows.append((seq_id, n, c, k))
        self._seen = now
        return rows, changes
