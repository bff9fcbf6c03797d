"""The state hash's view of the block tables (core/table_ledger.py): lengths every step and
each block once, from which every table can be rebuilt exactly at every step."""
from __future__ import annotations

import random

import pytest

from core.prefix_cache import PrefixCacheBlocks
from core.sched import Chunked, FreeListBlocks, Request, Scheduler, SchedulerConfig, StepOutput
from core.table_ledger import TableLedger

BS = 4


def traffic(pool, seed: int):
    """A scheduler under random traffic through a pool small enough to preempt (tables
    freed, allocated anew and grown); prompts share prefixes, so the cache hits. Yields
    after each schedule and after each step's outputs."""
    rng = random.Random(seed)
    sched = Scheduler(SchedulerConfig(max_batch_tokens=24, max_seqs=6), pool(BS, range(40)),
                      Chunked(8))
    heads = [[rng.randrange(1, 9) for _ in range(9)] for _ in range(3)]

    def add(n: int):
        sched.add(Request(rng.choice(heads) + [rng.randrange(1, 9) for _ in range(n)],
                          rng.randrange(1, 40)))
    for _ in range(12):
        add(rng.randrange(0, 12))
    steps = 0
    while sched.has_unfinished() and steps < 2000:
        out = sched.schedule()
        yield sched, out
        sched.on_step([StepOutput(i, rng.randrange(1, 9)) for i in out.decode] +
                      [StepOutput(c.id, rng.randrange(1, 9)) for c in out.prefill if c.last])
        yield sched, None
        steps += 1
        if steps % 7 == 0 and steps < 100:
            add(5)
    assert not sched.has_unfinished()


@pytest.mark.parametrize("pool", [FreeListBlocks, PrefixCacheBlocks])
def test_every_table_is_rebuilt_from_the_ledger_at_every_step(pool):
    ledger, rebuilt = TableLedger(), {}
    preempted = sent = held = 0
    for sched, out in traffic(pool, seed=1):
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
