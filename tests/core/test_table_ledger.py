"""The state hash's view of the block tables (core/table_growth.py): lengths every step and
each block once, from which every table can be rebuilt exactly at every step."""
from __future__ import annotations

import pytest

from core.prefix_cache import PrefixCacheBlocks
from core.sched import FreeListBlocks
from core.table_growth import TableLedger
from tests.table_traffic import traffic


@pytest.mark.parametrize("pool", [FreeListBlocks, PrefixCacheBlocks])
def test_every_table_is_rebuilt_from_the_ledger_at_every_step(pool):
    ledger, rebuilt = TableLedger(), {}
    preempted = sent = held = 0
    for _, sched, out in traffic(pool, seed=1):
        preempted += len(out.preempted) if out else 0
        running = sched.snapshot()[6]
        rows, changes = ledger.entries(running)
        for id, start, blocks in changes:
            table = [] if start == 0 else rebuilt[id]
            assert len(table) == start, (id, start)
            rebuilt[id] = table + blocks
            sent += len(blocks)
        rebuilt = {r[0]: rebuilt.get(r[0], []) for r in rows}   # the ledger forgets the rest
        assert rows == [(id, n, c, len(t)) for id, n, c, t in running]
        assert rebuilt == {id: list(t) for id, _, _, t in running}
        held += sum(len(t) for *_, t in running)
    assert preempted
    assert sent * 3 < held   # blocks go once, not with every step


def test_a_new_list_is_sent_whole_even_at_the_same_length():
    ledger = TableLedger()
    ledger.entries([(7, 5, 4, [1, 2])])
    assert ledger.entries([(7, 6, 5, [3, 4])])[1] == [(7, 0, [3, 4])]
    table = [3, 4]
    ledger.entries([(7, 6, 5, table)])
    table.append(9)
    assert ledger.entries([(7, 7, 6, table)]) == ([(7, 7, 6, 3)], [(7, 2, [9])])
    assert ledger.entries([(7, 8, 7, table)])[1] == []
