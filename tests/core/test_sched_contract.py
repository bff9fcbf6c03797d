"""The scheduler's 11 contract tests (docs/design/scheduler.md#the-contract-tests), driven by a fake model;
each runs twice: over the free list and over the prefix cache (docs/design/scheduler.md#prefix-cache)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from core.sched import (Chunk, Chunked, EmptyPrompt, Finished, FinishReason, FreeListBlocks,
                        NeverFits, NoCapacity, PrefixCacheBlocks, QueueFull, Request,
                        SchedPolicy, Scheduler, SchedulerConfig, StepOutput, TokenEvent, TooLong,
                        WholePrompt)
from tests.fake_model import FakeModel, continuation, run

FCFS, PRIORITY = SchedPolicy.FCFS, SchedPolicy.PRIORITY
LENGTH, STOP = FinishReason.LENGTH, FinishReason.STOP
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


POOLS = {"free": FreeListBlocks, "prefix": PrefixCacheBlocks}
_pool = [FreeListBlocks]  # what make() builds; the module's fixture switches it


@pytest.fixture(scope="module", autouse=True, params=list(POOLS))
def pool_kind(request):
    """Module scope: hypothesis refuses function-scoped fixtures on @given tests."""
    _pool[0] = POOLS[request.param]
    yield request.param
    _pool[0] = FreeListBlocks


def caching() -> bool:
    return _pool[0] is PrefixCacheBlocks


def make(num_blocks=64, block=4, policy=None, **cfg) -> Scheduler:
    prefill = cfg.pop("prefill", None)
    config = SchedulerConfig(policy=policy or PRIORITY, **cfg)
    return Scheduler(config, _pool[0](block, range(num_blocks)), prefill)


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 131 + i * 17 + 3) % 1000 for i in range(n)]


def expect(sched: Scheduler, req: Request, eos=None):
    return continuation(req.prompt, req.max_tokens, sched.cfg.max_model_len, eos)


def test_hand_example_schedule():
    sched = make(6, 4, FCFS, max_seqs=2, max_batch_tokens=8)
    reqs = [Request(prompt(5, 1), 3), Request(prompt(3, 2), 2), Request(prompt(2, 3), 1)]
    a, b, c = (sched.add(r) for r in reqs)
    assert (a, b, c) == (0, 1, 2)
    want = {i: expect(sched, r)[0] for i, r in enumerate(reqs)}
    fake, table = FakeModel(), sched.blocks.block_table

    out = sched.schedule()  # step 1: A and B admitted whole; S_max keeps C waiting
    assert out.prefill == [Chunk(a, 0, 5, True), Chunk(b, 0, 3, True)]
    assert out.decode == [] and out.preempted == []
    assert list(table(a)) == [0, 1] and list(table(b)) == [2] and list(table(c)) == []
    assert (sched.stats().running, sched.stats().waiting, sched.blocks.free_blocks()) == (2, 1, 3)
    ev = sched.on_step(fake.forward(sched, out))
    assert ev == [TokenEvent(a, want[a][0]), TokenEvent(b, want[b][0])]
    assert len(sched.tokens(a)) == 6 and len(sched.tokens(b)) == 4

    out = sched.schedule()  # step 2: two decodes; budget is left but S_max blocks C
    assert out.decode == [a, b] and out.prefill == [] and out.preempted == []
    assert list(table(a)) == [0, 1]
    ev = sched.on_step(fake.forward(sched, out))
    assert ev == [TokenEvent(a, want[a][1]), TokenEvent(b, want[b][1]), Finished(b, LENGTH)]
    assert sched.tokens(b) is None and list(table(b)) == [] and sched.blocks.free_blocks() == 4

    out = sched.schedule()  # step 3: A decodes, C takes block 2
    assert out.decode == [a] and out.prefill == [Chunk(c, 0, 2, True)]
    assert list(table(c)) == ([3] if caching() else [2])  # B's full block 2 stays cached
    ev = sched.on_step(fake.forward(sched, out))
    assert ev == [TokenEvent(c, want[c][0]), Finished(c, LENGTH),
                  TokenEvent(a, want[a][2]), Finished(a, LENGTH)]
    assert not sched.has_unfinished() and sched.blocks.free_blocks() == 6
    assert sched.stats().steps == 3 and sched.stats().finished == 3


def test_free_list_is_all_or_nothing():
    fl = _pool[0](4, [5, 3, 1, 4, 0, 2])  # nothing computed: the cache acts as a free list
    assert (fl.block_tokens(), fl.total_blocks(), fl.free_blocks()) == (4, 6, 6)
    assert fl.allocate("a", range(5)).cached_tokens == 0
    assert list(fl.block_table("a")) == [0, 1]
    fl.allocate("b", range(4))
    assert list(fl.block_table("b")) == [2]
    with pytest.raises(NoCapacity):
        fl.allocate("c", range(13))  # 4 blocks, 3 free
    assert fl.free_blocks() == 3 and list(fl.block_table("c")) == []
    with pytest.raises(NoCapacity):
        fl.append_slot("b", 17)  # would need 4 more
    assert list(fl.block_table("b")) == [2] and fl.free_blocks() == 3
    fl.append_slot("b", 4)  # still one block
    assert list(fl.block_table("b")) == [2]
    fl.append_slot("b", 5)
    assert list(fl.block_table("b")) == [2, 3]
    fl.release("a", [])
    assert fl.free_blocks() == 4 and list(fl.block_table("a")) == []
    fl.allocate("d", range(3))
    assert list(fl.block_table("d")) == [0]  # the lowest free id, not the last freed
    fl.allocate("e", range(9))
    assert list(fl.block_table("e")) == [1, 4, 5]
    assert fl.free_blocks() == 0


workload = st.lists(
    st.tuples(st.integers(1, 10), st.integers(1, 10), st.integers(-2, 2), st.integers(0, 6)),
    min_size=1, max_size=12)


@PROPERTY
@given(reqs=workload, block=st.sampled_from([2, 4]), extra=st.integers(0, 3),
       max_seqs=st.integers(1, 6), budget=st.integers(3, 24),
       policy=st.sampled_from([FCFS, PRIORITY]),
       aging=st.sampled_from([None, 1, 3]), chunk=st.sampled_from([None, 1, 3, 8]),
       margin=st.sampled_from([None, None, 1, 2]), ctx=st.sampled_from([None, 0, 3]))
def test_every_request_finishes_and_no_block_leaks(reqs, block, extra, max_seqs, budget, policy,
                                                   aging, chunk, margin, ctx):
    max_len = 2048 if ctx is None else 11 + ctx
    need = max(-(-min(p + m, max_len) // block) for p, m, _, _ in reqs)
    sched = make(need + extra, block, policy, max_seqs=max_seqs, max_batch_tokens=budget,
                 aging_steps=aging, preempt_margin=margin, max_model_len=max_len,
                 prefill=Chunked(chunk) if chunk else WholePrompt())
    arrivals: dict[int, list[Request]] = {}
    for i, (p, m, prio, at) in enumerate(reqs):
        arrivals.setdefault(at, []).append(Request(prompt(p, i), m, prio))
    res = run(sched, FakeModel(), 3000, arrivals)
    target(float(sched.stats().preemptions))
    assert not sched.has_unfinished(), "a request never finished"
    added = [r for at in sorted(arrivals) for r in arrivals[at]]
    for seq_id, req in zip(res.ids, added):
        toks, reason = expect(sched, req)
        assert res.outputs[seq_id] == toks and res.reasons[seq_id] == reason
        assert sched.tokens(seq_id) is None
    s = sched.stats()
    assert s.free_blocks == s.total_blocks and s.running == s.waiting == 0
    assert s.finished == len(reqs)


def test_priority_runs_first():
    reqs = [Request(prompt(3, 1), 2, 0), Request(prompt(3, 2), 2, 3), Request(prompt(3, 3), 2, 7)]
    order = {}
    for policy in (PRIORITY, FCFS):
        sched = make(policy=policy, max_seqs=1)
        res = run(sched, FakeModel(), 100, {0: reqs})
        order[policy] = sorted(res.ids, key=res.admitted_at.get)
    assert order[PRIORITY] == [2, 1, 0]
    assert order[FCFS] == [0, 1, 2]


@settings(PROPERTY, max_examples=25)
@given(aging=st.integers(1, 6), prio=st.integers(1, 8))
def test_aging_bounds_the_wait(aging, prio):
    bound = prio * aging

    def stream(step):  # one low request first, then one high request every step
        return ([Request([1], 1, 0)] if step == 0 else []) + [Request([2, step], 1, prio)]

    sched = make(max_seqs=1, aging_steps=aging)
    res = run(sched, FakeModel(), bound + 4, stream, until_idle=False)
    assert bound - 1 <= res.admitted_at.get(0, 10**9) <= bound + 1, "aging is off"

    starving = make(max_seqs=1, aging_steps=None)
    res = run(starving, FakeModel(), bound + 20, stream, until_idle=False)
    assert 0 not in res.admitted_at, "strict priority should starve the low request"
    assert len(res.admitted_at) == bound + 20


def test_preemption_recomputes_and_keeps_outputs():
    reqs = [Request(prompt(5 + i % 4, i), 12, i % 3) for i in range(6)]
    results = {}
    for blocks in (14, 64):
        sched = make(blocks, 4, max_seqs=8, max_batch_tokens=64)
        res = run(sched, FakeModel(), 500, {0: reqs})
        assert not sched.has_unfinished() and sched.blocks.free_blocks() == blocks
        results[blocks] = (res, sched.stats().preemptions, sched.blocks)
    (tight, preemptions, pool), (roomy, none, _) = results[14], results[64]
    assert preemptions > 0 and none == 0
    assert tight.outputs == roomy.outputs and tight.reasons == roomy.reasons
    for seq_id, req in zip(tight.ids, reqs):
        assert tight.outputs[seq_id] == expect(sched, req)[0]
    # a preempted request is prefilled again with its generated tokens, from position 0
    # (from a block boundary with the cache: its own computed blocks usually stay cached)
    victims = {seq_id for out in tight.schedules for seq_id in out.preempted}
    refills = [ch for out in tight.schedules for ch in out.prefill
               if ch.id in victims and ch.start + ch.length > len(reqs[ch.id].prompt)]
    assert victims and refills
    if caching():
        assert all(ch.start % 4 == 0 for ch in refills) and any(ch.start for ch in refills)
        assert pool.prefix_recompute_hit_tokens > 0
    else:
        assert all(ch.start == 0 for ch in refills)


def test_batched_greedy_equals_single_request():
    reqs = [Request(prompt(3 + 2 * i, i), 6 + i, 0) for i in range(4)]
    batched = run(make(max_seqs=4, max_batch_tokens=32), FakeModel(), 200, {0: reqs})
    for seq_id, req in zip(batched.ids, reqs):
        alone = run(make(max_seqs=1), FakeModel(), 200, {0: [req]})
        assert batched.outputs[seq_id] == alone.outputs[0]
        assert len(alone.outputs[0]) == req.max_tokens


def test_abort_frees_blocks_and_drops_waiting():
    sched = make(16, 4, max_seqs=2)
    a, b, c = (sched.add(Request(prompt(6, i), 5)) for i in range(3))
    fake = FakeModel()
    sched.on_step(fake.forward(sched, sched.schedule()))
    assert sched.stats().running == 2 and sched.stats().waiting == 1
    assert sched.blocks.free_blocks() == 16 - 2 * 2
    sched.abort(a)  # running
    sched.abort(c)  # waiting
    assert sched.blocks.free_blocks() == 16 - 2 and list(sched.blocks.block_table(a)) == []
    s = sched.stats()
    assert (s.running, s.waiting, s.finished) == (1, 0, 2)
    assert sched.tokens(a) is None and sched.tokens(c) is None and sched.unfinished() == [b]
    out = sched.schedule()
    assert out.decode == [b] and out.prefill == []
    events = sched.on_step(fake.forward(sched, out))
    assert {e.id for e in events} == {b}
    sched.abort(b)
    assert sched.blocks.free_blocks() == 16 and not sched.has_unfinished()


@pytest.mark.parametrize("size, admitted", [(6, False), (5, True)])
def test_decodes_count_against_the_budget(size, admitted):
    sched = make(32, 4, max_seqs=4, max_batch_tokens=8)
    fake = FakeModel()
    for i in range(3):
        sched.add(Request(prompt(2, i), 4))
    sched.on_step(fake.forward(sched, sched.schedule()))  # 6 of 8 tokens
    d = sched.add(Request(prompt(size, 9), 4))
    out = sched.schedule()
    assert out.decode == [0, 1, 2]  # 3 of 8 tokens: 5 left
    assert out.prefill == ([Chunk(d, 0, size, True)] if admitted else [])
    assert len(out.decode) + sum(ch.length for ch in out.prefill) <= 8


def test_stop_finishes_with_stop():
    sched = make(8, 4)
    seq_id = sched.add(Request(prompt(3), 5))
    sched.schedule()
    events = sched.on_step([StepOutput(seq_id, 7, stop=True)])
    assert events == [TokenEvent(seq_id, 7), Finished(seq_id, STOP)]
    assert sched.tokens(seq_id) is None and sched.blocks.free_blocks() == 8
    # STOP wins when max_tokens is reached by the same token
    seq_id = sched.add(Request(prompt(3), 1))
    sched.schedule()
    assert sched.on_step([StepOutput(seq_id, 9, stop=True)])[-1] == Finished(seq_id, STOP)
    # through the fake model: EOS as the third token ends the answer there
    req = Request(prompt(4, 5), 10)
    eos = expect(sched, req)[0][2]
    res = run(sched, FakeModel(eos=eos), 50, {0: [req]})
    (seq_id,) = res.ids
    assert res.outputs[seq_id] == expect(sched, req)[0][:3] and res.reasons[seq_id] == STOP


def test_admission_refuses_what_can_never_run():
    sched = make(4, 4, max_waiting=2, max_model_len=16)
    before = sched.stats()
    with pytest.raises(EmptyPrompt):
        sched.add(Request([], 4))
    with pytest.raises(TooLong) as e:
        sched.add(Request(prompt(16), 1))
    assert (e.value.tokens, e.value.limit) == (16, 16)
    with pytest.raises(NeverFits) as e:
        big = make(4, 4, max_model_len=64)
        big.add(Request(prompt(10), 7))  # 17 positions: 5 blocks of a 4-block pool
    assert (e.value.blocks, e.value.total) == (5, 4)
    assert big.add(Request(prompt(10), 6)) == 0  # 16 positions: exactly the pool
    assert sched.stats() == before
    assert sched.add(Request(prompt(15), 100)) == 0  # capped by the context: 16 positions
    assert sched.add(Request(prompt(2), 1)) == 1
    with pytest.raises(QueueFull):
        sched.add(Request(prompt(2), 1))
    with pytest.raises(EmptyPrompt):  # checked before the queue
        sched.add(Request([], 1))
    sched.on_step(FakeModel().forward(sched, sched.schedule()))
    assert sched.add(Request(prompt(2), 1)) == 2  # refusals used no id
