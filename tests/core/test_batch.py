"""core/batch.py: the one ForwardBatch layout, fed by a schedule (build_batch) or by hand
(worker/handmade.py), and the slot formula in its list and tensor forms."""
from __future__ import annotations

import random

import pytest
import torch

from core.batch import build_batch, sampled_ids, slots
from core.ipc.protocol import I32, SamplingParams
from core.table_growth import KeptTables
from core.prefix_cache import PrefixCacheBlocks
from core.sched import Chunked, FreeListBlocks, Request, Scheduler, SchedulerConfig, StepOutput
from tests.table_traffic import BS, traffic
from worker.handmade import Part, make_batch
from worker.step import seq_slots


def test_a_schedule_and_hand_made_parts_give_the_same_layout():
    sched = Scheduler(SchedulerConfig(max_batch_tokens=9), FreeListBlocks(BS, range(32)),
                      Chunked(8))
    a = sched.add(Request([5, 6, 7, 8, 9], 8))
    assert sampled_ids(sched.schedule()) == [a]   # the whole prompt
    sched.on_step([StepOutput(a, 42)])
    b = sched.add(Request(list(range(100, 120)), 4))
    out = sched.schedule()
    assert out.decode == [a] and [(c.id, c.start, c.length, c.last) for c in out.prefill] == [
        (b, 0, 8, False)]
    sp = SamplingParams(temperature=0.5, seed=3)
    got = build_batch(7, out, sched, {a: sp})
    ta, tb = sched.tokens(a), sched.tokens(b)
    want = make_batch([Part(ta, len(ta) - 1, 1, sched.blocks.block_table(a), params=sp,
                            gen_index=1),
                       Part(tb, 0, 8, sched.blocks.block_table(b), sample=False)], BS, step=7)
    want.seq_ids = I32([a, b])
    assert got == want
    assert sampled_ids(out) == [a]


def test_list_and_tensor_slots_agree():
    rng = random.Random(0)
    table = rng.sample(range(50), 10)
    pos = list(range(10 * BS))
    rng.shuffle(pos)
    assert slots([table] * len(pos), pos, BS) == seq_slots(
        torch.tensor(table), torch.tensor(pos), BS).tolist()
    assert slots([[3, 9]], [5], BS) == [9 * BS + 1]


@pytest.mark.parametrize("pool", [FreeListBlocks, PrefixCacheBlocks])
def test_kept_table_bytes_give_the_batch_a_fresh_conversion_gives(pool):
    """Random traffic through a pool small enough to preempt (tables freed, allocated anew
    and grown): every step's block_tables through one KeptTables equal a conversion from
    scratch."""
    kept, preempted = KeptTables(), 0
    for step, sched, out in traffic(pool, seed=1):
        if out is None:
            continue
        preempted += len(out.preempted)
        got = build_batch(step, out, sched, {}, None, kept)
        assert got == build_batch(step, out, sched, {}), step
    assert preempted
