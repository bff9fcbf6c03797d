"""The prefix cache's BlockSpace (core/prefix_cache.py, docs/design/scheduler.md#prefix-cache): unit
tests of the cache, the scheduler's hooks, and property tests against the free list."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.heap import LazyHeap
from core.prefix_cache import _ROOT, PrefixCacheBlocks, block_key
from core.sched import (Chunk, Chunked, FreeListBlocks, NoCapacity, Request, SchedPolicy,
                        Scheduler, SchedulerConfig, WholePrompt)
from tests.fake_model import FakeModel, continuation, run

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


class Checked(PrefixCacheBlocks):
    """Checks the cache's invariants after every change and counts evictions."""

    evictions = 0

    def allocate(self, id, tokens, priority=0, **kw):
        try:
            return super().allocate(id, tokens, priority, **kw)
        finally:
            check(self)

    def append_slot(self, id, total):
        try:
            super().append_slot(id, total)
        finally:
            check(self)

    def release(self, id, computed=()):
        super().release(id, computed)
        check(self)

    def computed(self, id, tokens, upto):
        super().computed(id, tokens, upto)
        check(self)

    def _evict(self):
        self.evictions += 1
        return super()._evict()


def check(c: PrefixCacheBlocks) -> None:
    held: dict[int, int] = {}
    for table in c._tables.values():
        for b in table:
            held[b] = held.get(b, 0) + 1
    assert c._ref == held, "a reference count is off"
    free, cached = set(c._free), set(c._handle)
    assert len(free) == len(c._free) and not (free & cached) and not (free & held.keys())
    assert not (cached & held.keys()) and len(free | cached | held.keys()) == c.total_blocks()
    assert {b: k for k, b in c._block.items()} == c._key and cached <= c._key.keys()
    assert not (free & c._key.keys()) and c._owner.keys() == c._key.keys()
    assert c._prio.keys() == held.keys() | cached and len(c._evictable) == len(cached)
    assert c.free_blocks() == len(free) + len(cached) and c.cached_blocks() == len(cached)


def state(c: PrefixCacheBlocks) -> tuple:
    live = sorted((e[0], e[2]) for e in c._evictable._heap if LazyHeap.alive(e))
    return (sorted(c._free), live, dict(c._ref), dict(c._key), dict(c._prio), dict(c._owner),
            {k: list(v) for k, v in c._tables.items()}, dict(c._done), c.summary(), c._clock)


def toks(n: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17 + 3) % 1000 for i in range(n)]


# ---------------------------------------------------------------------- the cache alone

def test_block_keys_are_a_deterministic_chain():
    first = block_key(_ROOT, [1, 2, 3, 4])
    assert first.hex() == "8deba87966784be537826232b56f15e9"  # the same in every process
    assert block_key(first, [5, 6, 7, 8]).hex() == "6dd5e4fd2ce25b5d2a6bb80a1471ce35"
    assert block_key(_ROOT, (1, 2, 3, 4)) == block_key(_ROOT, range(1, 5)) == first
    assert block_key(first, [1, 2, 3, 4]) != first  # the parent is part of the key
    assert block_key(_ROOT, [12, 3]) != block_key(_ROOT, [1, 23])


def test_full_blocks_are_shared_and_reference_counted():
    c = Checked(4, range(8))
    a = toks(9, 1)
    assert c.allocate("a", a).cached_tokens == 0 and list(c.block_table("a")) == [0, 1, 2]
    c.computed("a", a, 6)  # one full block computed
    assert c._key.keys() == {0} and c.cached_blocks() == 0
    c.computed("a", a, 9)
    assert c._key.keys() == {0, 1}  # block 2 (position 8) is not full
    b = a[:8] + [7, 7, 7]
    assert c.cached_prefix(b) == 8
    assert c.allocate("b", b).cached_tokens == 8 and list(c.block_table("b")) == [0, 1, 3]
    assert c._ref == {0: 2, 1: 2, 2: 1, 3: 1} and c.free_blocks() == 4
    c.release("a", a)
    assert c._ref == {0: 1, 1: 1, 3: 1} and c.free_blocks() == 5 and c.cached_blocks() == 0
    c.release("b", b)
    assert c._ref == {} and c.free_blocks() == c.total_blocks() == 8 and c.cached_blocks() == 2
    assert (c.prefix_query_tokens, c.prefix_hit_tokens, c.prefix_recompute_hit_tokens) == (20, 8, 0)
    c.allocate("b", b)
    with pytest.raises(ValueError):
        c.allocate("b", b)  # one table per id


def test_a_hit_never_covers_the_last_token():
    c = Checked(4, range(8))
    a = toks(8, 2)
    c.allocate("a", a)
    c.release("a", a)  # both blocks full and computed: cached
    assert c.cached_blocks() == 2
    # the same 8 tokens again: position 7 must be computed into a block it owns alone
    assert c.cached_prefix(a) == 4
    assert c.allocate("b", a).cached_tokens == 4 and list(c.block_table("b")) == [0, 2]
    assert c.allocate("c", a + [5]).cached_tokens == 8 and list(c.block_table("c")) == [0, 1, 3]
    assert c.allocate("d", a[:4]).cached_tokens == 0 and c.allocate("e", a[:1]).cached_tokens == 0
    assert c.allocate("f", a[:5]).cached_tokens == 4


def test_no_capacity_changes_nothing():
    c = Checked(2, range(4))
    a = toks(4, 3)
    c.allocate("a", a)
    c.release("a", a)  # blocks 0, 1 cached, 2, 3 free
    c.allocate("x", toks(2, 4))  # takes block 2
    before = state(c)
    # a's 2 cached blocks and 3 fresh need 5 of the 3 free; the 3 fresh alone would fit
    # only by evicting the hits
    with pytest.raises(NoCapacity):
        c.allocate("b", a + toks(5, 5))
    assert state(c) == before
    with pytest.raises(NoCapacity):
        c.append_slot("x", 9)  # 4 more blocks, 3 free
    assert state(c) == before
    assert c.allocate("b", a + [9]).cached_tokens == 4  # 2 hits + 1 fresh: fits
    assert list(c.block_table("b")) == [0, 1, 3] and c.free_blocks() == 0


def test_eviction_takes_free_blocks_first_then_low_priority_then_lru():
    c = Checked(2, range(8))
    seqs = {"hi": (toks(4, 10), 5), "lo1": (toks(4, 11), 0), "lo2": (toks(4, 12), 0)}
    for name, (t, prio) in seqs.items():
        c.allocate(name, t, priority=prio)
    assert list(c.block_table("lo2")) == [4, 5]
    for name, (t, _) in seqs.items():
        c.release(name, t)
    assert c.cached_blocks() == 6 and c.free_blocks() == 8
    # 2 truly free blocks first (lowest id), then the priority-0 blocks, oldest first; a
    # released table's deeper block is older than its head
    c.allocate("new", toks(10, 13), priority=9)
    assert list(c.block_table("new")) == [6, 7, 3, 2, 5]
    assert c.cached_prefix(seqs["hi"][0] + [1]) == 4  # priority 5 kept
    assert c.cached_prefix(seqs["lo2"][0] + [1]) == 2  # head 4 kept, block 5 evicted
    assert c.cached_prefix(seqs["lo1"][0] + [1]) == 0


def test_a_hit_makes_blocks_recently_used():
    c = Checked(2, range(4))
    x, y = toks(4, 15), toks(4, 16)
    for name, t in (("x", x), ("y", y)):
        c.allocate(name, t)
        c.release(name, t)
    c.allocate("x2", x + [1])  # hits x's blocks 0, 1; its fresh block evicts y's tail 3
    assert list(c.block_table("x2")) == [0, 1, 3]
    c.release("x2", x + [1])
    c.allocate("z", toks(6, 17))  # the free block 3, then y's head, then x's tail
    assert list(c.block_table("z")) == [3, 2, 1] and c.cached_prefix(x + [1]) == 2


def test_idle_space_is_all_free_and_drop_forgets_every_key():
    c = Checked(4, [9, 3, 5])
    assert c.free_blocks() == c.total_blocks() == 3 and c.cached_blocks() == 0
    a = toks(9, 6)
    c.allocate("a", a)
    assert list(c.block_table("a")) == [3, 5, 9]
    c.computed("missing", a, 9)  # an id holding nothing is ignored
    c.computed("a", a, 9)
    c.computed("a", a, 5)        # never backwards
    assert len(c._key) == 2
    c.drop_cached()  # while held: keys gone, blocks still held
    assert c._key == {} and c.free_blocks() == 0
    c.release("a", a)  # no re-registration of blocks it computed before the drop
    assert c.free_blocks() == 3 and c.cached_blocks() == 0
    c.allocate("b", a)
    c.release("b", a)
    assert c.cached_blocks() == 2
    c.drop_cached()
    assert c.cached_blocks() == 0 and c.free_blocks() == 3 and c.cached_prefix(a) == 0
    assert c.summary() == (0, 0, 18, 0, 0)


# ---------------------------------------------------------------------- with the scheduler

def make(num_blocks=64, block=4, policy=SchedPolicy.PRIORITY, prefill=None, **cfg):
    return Scheduler(SchedulerConfig(policy=policy, **cfg), Checked(block, range(num_blocks)),
                     prefill)


def expect(sched, req):
    return continuation(req.prompt, req.max_tokens, sched.cfg.max_model_len)[0]


SYS = toks(16, 50)  # a shared system prompt: four blocks of 4


def test_blocks_are_cached_while_their_request_runs():
    sched = make(prefill=Chunked(8), max_batch_tokens=16)
    reqs = [Request(SYS + [1, 2, 3], 4), Request(SYS + [4, 5], 4), Request(SYS + [6], 3)]
    res = run(sched, FakeModel(), 100, {0: reqs[:1], 1: reqs[1:2], 6: reqs[2:]})
    a, b, c = res.ids
    first = {i: next(ch for out in res.schedules for ch in out.prefill if ch.id == i)
             for i in res.ids}
    # a computed positions 0..7 in step 0; b, admitted in step 1, skips them
    assert first[b] == Chunk(b, 8, 8, False) and first[c] == Chunk(c, 16, 1, True)
    for i, req in zip(res.ids, reqs):
        assert res.outputs[i] == expect(sched, req)
    pool = sched.blocks
    assert (pool.prefix_hit_tokens, pool.prefix_recompute_hit_tokens) == (24, 0)
    assert pool.prefix_query_tokens == 19 + 18 + 17
    assert pool.free_blocks() == 64 and pool._ref == {}


def test_equal_blocks_computed_in_one_step_keep_one_cached_copy():
    sched = make(max_batch_tokens=64)
    reqs = [Request(SYS[:8] + [1], 6), Request(SYS[:8] + [2], 6), Request(SYS[:8] + [3], 2)]
    fake = FakeModel()
    res = run(sched, fake, 2, {0: reqs[:2]}, until_idle=False)
    a, b = res.ids
    assert list(sched.blocks.block_table(a)) == [0, 1, 2]  # both computed the prefix
    assert list(sched.blocks.block_table(b)) == [3, 4, 5]
    c = sched.add(reqs[2])
    res2 = run(sched, fake, 50)
    assert res2.schedules[0].prefill == [Chunk(c, 8, 1, True)]  # a's copy, the higher rank
    assert sched.blocks.prefix_hit_tokens == 8
    assert res.outputs[b] + res2.outputs[b] == expect(sched, reqs[1])
    assert res2.outputs[c] == expect(sched, reqs[2])
    assert sched.blocks.cached_blocks() == len(sched.blocks._key)


def test_whole_prompt_sizes_only_the_computed_tokens():
    sched = make(prefill=WholePrompt(), max_batch_tokens=8)
    first = Request(SYS[:8] + [1], 10)  # longer than the budget: admitted alone
    fake = FakeModel()
    run(sched, fake, 2, {0: [first]}, until_idle=False)
    second = sched.add(Request(SYS[:8] + [2, 3], 3))  # 10 tokens, 2 to compute
    out = sched.schedule()
    assert out.decode == [0] and out.prefill == [Chunk(second, 8, 2, True)]
    sched.on_step(fake.forward(sched, out))
    run(sched, fake, 50)
    assert sched.blocks.free_blocks() == 64


@pytest.mark.parametrize("policy, aging, want", [
    (SchedPolicy.PRIORITY, 32, 3), (SchedPolicy.PRIORITY, None, 3), (SchedPolicy.FCFS, 32, 0)])
def test_blocks_get_the_priority_level_not_the_aged_key(policy, aging, want):
    sched = make(policy=policy, aging_steps=aging)
    for _ in range(5):
        sched.schedule()
    seq_id = sched.add(Request(toks(6, 7), 4, priority=3))
    sched.schedule()
    assert sched.blocks._req_prio[seq_id] == want
    assert {sched.blocks._prio[b] for b in sched.blocks.block_table(seq_id)} == {want}


def test_an_abort_mid_step_registers_only_what_was_computed():
    sched = make(prefill=Chunked(4), max_batch_tokens=4)
    seq_id = sched.add(Request(toks(12, 8), 3))
    fake = FakeModel()
    sched.on_step(fake.forward(sched, sched.schedule()))  # positions 0..3
    outputs = fake.forward(sched, sched.schedule())        # positions 4..7 in flight
    sched.abort(seq_id)                                    # meanwhile
    sched.on_step(outputs)
    assert sched.blocks.cached_blocks() == 1 and sched.blocks.free_blocks() == 64


@pytest.mark.parametrize("drop", [True, False])
def test_preempt_all_forgets_the_lost_kv(drop, monkeypatch):
    if not drop:  # the mistake the drop prevents: hits on K/V the new worker lacks
        monkeypatch.setattr(PrefixCacheBlocks, "drop_cached", lambda self: None)
    sched = make(32, 4, prefill=Chunked(3), max_seqs=4)
    reqs = [Request(toks(6 + i, i), 6, i) for i in range(5)]
    before = run(sched, FakeModel(), 4, {0: reqs}, until_idle=False)
    assert sched.blocks.cached_blocks() + len(sched.blocks._key) > 0
    sched.preempt_all()
    after = run(sched, FakeModel(), 200)  # a new worker: an empty KV cache
    got = [before.outputs[i] + after.outputs.get(i, []) for i in range(5)]
    right = got == [expect(sched, r) for r in reqs]
    assert right == drop and sched.blocks.free_blocks() == 32


# ---------------------------------------------------------------------- properties

def prompt_of(i: int, family: int, shared: int, own: int) -> list[int]:
    head = toks(20, 100 + family)[:shared] if family >= 0 else []
    return head + toks(own, i) if head or own else toks(1, i)


workload = st.lists(st.tuples(st.integers(-1, 2), st.integers(0, 20), st.integers(0, 5),
                              st.integers(1, 8), st.integers(-1, 1), st.integers(0, 12)),
                    min_size=2, max_size=10)


@PROPERTY
@given(reqs=workload, block=st.sampled_from([2, 4]), room=st.sampled_from([0, 1, 3, None]),
       max_seqs=st.integers(1, 5), budget=st.integers(4, 24),
       policy=st.sampled_from([SchedPolicy.FCFS, SchedPolicy.PRIORITY]),
       chunk=st.sampled_from([None, 3, 8]), margin=st.sampled_from([None, 1]),
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9)), max_size=3))
def test_the_cache_changes_no_token(reqs, block, room, max_seqs, budget, policy, chunk, margin,
                                    aborts):
    requests = [Request(prompt_of(i, f, s, o), m, p) for i, (f, s, o, m, p, _) in enumerate(reqs)]
    arrivals: dict[int, list[Request]] = {}
    for req, spec in zip(requests, reqs):
        arrivals.setdefault(spec[5], []).append(req)
    order = [r for at in sorted(arrivals) for r in arrivals[at]]
    sizes = [-(-(len(r.prompt) + r.max_tokens) // block) for r in requests]
    num_blocks = 2 * sum(sizes) if room is None else max(sizes) + room
    cut = {}
    for step, k in aborts:
        cut.setdefault(step, []).append(k)
    runs = {}
    for kind in (FreeListBlocks, Checked):
        sched = Scheduler(SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=budget,
                                          policy=policy, preempt_margin=margin),
                          kind(block, range(num_blocks)), Chunked(chunk) if chunk else None)
        res = run(sched, FakeModel(), 3000, arrivals, aborts=cut)
        assert not sched.has_unfinished() and sched.blocks.free_blocks() == num_blocks
        for seq_id, req in zip(res.ids, order):
            want = continuation(req.prompt, req.max_tokens, 2048)[0]
            assert res.outputs[seq_id] == want[:len(res.outputs[seq_id])]
            if seq_id in res.reasons:
                assert res.outputs[seq_id] == want
        runs[kind] = res, sched.blocks
    (plain, _), (cached, pool) = runs[FreeListBlocks], runs[Checked]
    assert pool._ref == {} and pool._tables == {} and pool._done == {}
    assert pool.prefix_hit_tokens <= pool.prefix_query_tokens
    assert pool.prefix_recompute_hit_tokens <= pool.prefix_hit_tokens
    if pool.evictions == 0:
        assert pool.prefix_hit_tokens >= must_hit(cached, order, block)


def must_hit(res, order: list[Request], B: int) -> int:
    """With nothing evicted, a request admitted after another with its first block (within
    its cap) finished must hit that block."""
    done = {i: res.finished_at[i] for i in res.reasons}
    for j, req in zip(res.ids, order):
        if j not in res.admitted_at or len(req.prompt) <= B:
            continue
        for i, other in zip(res.ids, order):
            if i in done and done[i] < res.admitted_at[j] and other.prompt[:B] == req.prompt[:B]:
                return B
    return 0


def test_shared_prefixes_hit_under_load():
    """A steady stream over three system prompts in a tight pool: preemption, eviction and
    hits together, and every answer right."""
    reqs = {s: [Request(toks(16, 100 + (s + i) % 3) + toks(1 + (s * 7 + i) % 6, 1000 + s * 3 + i),
                        4 + (s + i) % 5, (s * i) % 3 - 1) for i in range(3)] for s in range(0, 30, 2)}
    sched = make(20, 4, prefill=Chunked(8), max_seqs=6, max_batch_tokens=24)
    res = run(sched, FakeModel(), 2000, reqs, aborts={9: [4], 20: [30]})
    order = [r for at in sorted(reqs) for r in reqs[at]]
    for seq_id, req in zip(res.ids, order):
        if seq_id in res.reasons:
            assert res.outputs[seq_id] == expect(sched, req)
    pool = sched.blocks
    assert sched.stats().preemptions > 0 and pool.evictions > 0
    assert pool.prefix_hit_tokens > pool.prefix_query_tokens // 3
    assert pool.free_blocks() == 20 and pool._ref == {}
