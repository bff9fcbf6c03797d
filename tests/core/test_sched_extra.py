"""Scheduler behaviour beyond the 11 contract tests: chunked prefill, preempt_margin, input
validation, abort, determinism, preempt_all, victim choice, head-of-line admission."""
from __future__ import annotations

import pytest

from core.heap import LazyHeap
from core.sched import (AdmitError, Chunk, Chunked, Finished, FinishReason, InvalidRequest,
                        Request, SchedPolicy, SchedulerConfig, StepOutput, TokenEvent)
from tests.core.test_sched_contract import FCFS, PRIORITY, expect, make, pool_kind, prompt  # noqa: F401
from tests.fake_model import FakeModel, check_blocks, continuation, run

# pool_kind (autouse) runs every test here over the free list and over the prefix cache

LENGTH = FinishReason.LENGTH


@pytest.mark.parametrize("max_chunk, chunks", [(12, 1), (6, 2), (5, 3), (4, 3)])
def test_chunked_prefill_same_outputs_within_budget(max_chunk, chunks):
    reqs = [Request(prompt(12, 1), 5), Request(prompt(7, 2), 6), Request(prompt(3, 3), 4)]
    sched = make(64, 4, max_seqs=4, max_batch_tokens=12, prefill=Chunked(max_chunk))
    res = run(sched, FakeModel(), 200, {0: reqs[:1], 1: reqs[1:]})  # the driver checks the budget
    first = [ch for out in res.schedules for ch in out.prefill if ch.id == 0]
    assert len(first) == chunks and [ch.last for ch in first] == [False] * (chunks - 1) + [True]
    assert [ch.start for ch in first] == [sum(c.length for c in first[:i]) for i in range(chunks)]
    for seq_id, req in zip(res.ids, reqs):
        assert res.outputs[seq_id] == expect(sched, req)[0]


def test_only_the_last_chunk_samples():
    sched = make(64, 4, max_batch_tokens=4, prefill=Chunked(4))
    seq_id = sched.add(Request(prompt(10), 3))
    out = sched.schedule()
    assert out.prefill == [Chunk(seq_id, 0, 4, False)]
    assert sched.on_step([StepOutput(seq_id, 5)]) == []  # a non-last chunk samples nothing
    assert len(sched.tokens(seq_id)) == 10
    assert sched.schedule().prefill == [Chunk(seq_id, 4, 4, False)]
    sched.on_step([])
    assert sched.schedule().prefill == [Chunk(seq_id, 8, 2, True)]
    assert sched.on_step([StepOutput(seq_id, 5)]) == [TokenEvent(seq_id, 5)]
    assert sched.schedule().decode == [seq_id]


def test_decodes_beyond_the_budget_wait_in_rank_order():
    sched = make(64, 4, max_seqs=4, max_batch_tokens=8)
    ids = [sched.add(Request(prompt(2, i), 5, priority=i)) for i in range(4)]
    sched.on_step(FakeModel().forward(sched, sched.schedule()))
    sched.cfg.max_batch_tokens = 2  # limits may be tuned between steps
    out = sched.schedule()
    assert out.decode == [ids[3], ids[2]] and out.prefill == []


def _full_batch(margin, policy=PRIORITY, aging=32):
    sched = make(64, 4, policy, max_seqs=2, aging_steps=aging, preempt_margin=margin)
    low = [sched.add(Request(prompt(4, i), 20)) for i in range(2)]
    fake = FakeModel()
    for _ in range(3):
        sched.on_step(fake.forward(sched, sched.schedule()))
    return sched, fake, low, sched.add(Request(prompt(4, 9), 3, priority=5))


@pytest.mark.parametrize("aging", [32, None])
def test_margin_seats_a_high_priority_arrival_at_once(aging):
    sched, fake, low, high = _full_batch(1, aging=aging)
    out = sched.schedule()
    assert out.preempted == [low[1]]  # the newest of the equal-ranked running requests
    assert out.decode == [low[0]] and out.prefill == [Chunk(high, 0, 4, True)]
    sched.on_step(fake.forward(sched, out))
    res = run(sched, fake, 200)
    assert not sched.has_unfinished() and sched.blocks.free_blocks() == 64
    assert res.outputs[low[1]] == continuation(prompt(4, 1), 20, 2048)[0][3:]


@pytest.mark.parametrize("margin, policy", [(None, PRIORITY), (6, PRIORITY), (1, FCFS)])
def test_margin_off_or_too_small_keeps_seed_behaviour(margin, policy):
    sched, fake, low, high = _full_batch(margin, policy)
    out = sched.schedule()
    assert out.preempted == [] and out.prefill == [] and out.decode == low


def test_margin_frees_blocks_for_a_high_priority_arrival():
    sched = make(6, 4, max_seqs=8, preempt_margin=2, aging_steps=None)
    low = [sched.add(Request(prompt(6, i), 4, priority=i)) for i in range(3)]  # 2 blocks each
    fake = FakeModel()
    sched.on_step(fake.forward(sched, sched.schedule()))
    assert sched.blocks.free_blocks() == 0
    high = sched.add(Request(prompt(7, 9), 1, priority=3))  # beats only low[0] and low[1] by 2
    out = sched.schedule()
    assert out.preempted == [low[0]] and out.prefill == [Chunk(high, 0, 7, True)]
    assert out.decode == [low[2], low[1]]


def test_no_skipping_ahead_when_the_head_does_not_fit():
    sched = make(6, 4, FCFS, max_seqs=8)
    first = sched.add(Request(prompt(12, 1), 8))  # 3 blocks, grows to 5
    fake = FakeModel()
    sched.on_step(fake.forward(sched, sched.schedule()))
    big = sched.add(Request(prompt(12, 2), 1))     # 3 blocks: 3 free, but a decode takes one
    small = sched.add(Request(prompt(2, 3), 1))    # would fit, must not jump the queue
    for _ in range(3):
        out = sched.schedule()
        assert out.prefill == [] and out.decode == [first]
        sched.on_step(fake.forward(sched, out))
    res = run(sched, fake, 50)
    assert res.admitted_at[big] <= res.admitted_at[small]
    (step,) = [out for out in res.schedules if out.prefill]
    assert [ch.id for ch in step.prefill] == [big, small]


def _step_until_preemption(sched, fake, limit=20):
    for _ in range(limit):
        out = sched.schedule()
        sched.on_step(fake.forward(sched, out))
        check_blocks(sched)
        if out.preempted:
            return out
    raise AssertionError("no preemption")


def test_victim_is_the_lowest_ranked_request():
    sched = make(4, 4, max_seqs=4)
    hi = sched.add(Request(prompt(4, 1), 8, priority=1))
    lo = sched.add(Request(prompt(4, 2), 8, priority=0))
    out = _step_until_preemption(sched, FakeModel())  # both need a third block at n = 9
    assert out.decode == [hi] and out.preempted == [lo] and len(sched.tokens(hi)) == 10


def test_the_last_request_preempts_itself():
    sched = make(3, 4, max_seqs=4)
    hi = sched.add(Request(prompt(4, 1), 8, priority=1))  # grows to 2 blocks at step 2
    lo = sched.add(Request(prompt(3, 2), 8, priority=0))  # wants its 2nd block at step 3
    out = _step_until_preemption(sched, FakeModel())
    assert out.decode == [hi] and out.preempted == [lo] and len(sched.tokens(hi)) == 7


def test_context_limit_finishes_with_length_and_stop_wins():
    sched = make(16, 4, max_model_len=6)
    seq_id = sched.add(Request(prompt(4), 50))
    res = run(sched, FakeModel(), 20)
    assert len(res.outputs[seq_id]) == 2 and res.reasons[seq_id] == LENGTH
    seq_id = sched.add(Request(prompt(5), 50))
    sched.schedule()
    stop = sched.on_step([StepOutput(seq_id, 3, stop=True)])[-1]
    assert stop == Finished(seq_id, FinishReason.STOP)


BAD = [
    Request("abc", 4), Request(None, 4), Request([1, -1], 4), Request([1, True], 4),
    Request([1.0], 4), Request([1], 0), Request([1], True), Request([1], 1.5),
    Request([1], 4, 1001), Request([1], 4, -1001), Request([1], 4, True), Request([1], 4, "1"),
    ([1], 4), None,
]


@pytest.mark.parametrize("req", BAD)
def test_bad_input_raises_invalid_request_and_changes_nothing(req):
    sched = make(8, 4)
    before = sched.stats(), sched.snapshot()
    with pytest.raises(InvalidRequest) as e:
        sched.add(req)
    assert isinstance(e.value, AdmitError) and isinstance(e.value, ValueError) and str(e.value)
    assert (sched.stats(), sched.snapshot()) == before
    assert sched.add(Request([1, 2], 1, 1000)) == 0


def test_abort_is_idempotent_and_ignores_unknown_ids():
    sched = make(8, 4)
    seq_id = sched.add(Request(prompt(5), 3))
    sched.schedule()
    sched.abort(seq_id)
    state = sched.stats(), sched.snapshot()
    for junk in (seq_id, 99, -1, "x", None, [1]):
        sched.abort(junk)
    assert (sched.stats(), sched.snapshot()) == state and state[0].finished == 1
    assert sched.on_step([StepOutput(seq_id, 4)]) == []  # aborted mid-step: its output is dropped
    assert sched.blocks.free_blocks() == 8


def test_two_schedulers_fed_the_same_inputs_agree():
    reqs = {s: [Request(prompt(1 + (3 * s + i) % 9, s * 10 + i), 1 + (s + i) % 7, (s * i) % 3)
                for i in range(3)] for s in range(0, 12, 2)}
    runs = []
    for _ in range(2):
        sched = make(6, 4, max_seqs=4, max_batch_tokens=10)
        res = run(sched, FakeModel(), 500, reqs)
        runs.append((res.ids, res.schedules, res.outputs, sched.snapshot(), sched.stats()))
    assert runs[0] == runs[1]
    assert runs[0][0] == list(range(18)) and runs[0][4].preemptions > 0


def test_preempt_all_requeues_everything_and_keeps_outputs():
    sched = make(32, 4, max_seqs=4, prefill=Chunked(3))
    reqs = [Request(prompt(5 + i, i), 6, i) for i in range(5)]
    fake = FakeModel()
    before = run(sched, fake, 3, {0: reqs}, until_idle=False)
    running = sorted(e[0] for e in sched.snapshot()[6])
    assert running == [1, 2, 3, 4]
    assert sched.preempt_all() == [1, 2, 3, 4]  # lowest rank first
    s = sched.stats()
    assert (s.running, s.waiting, s.free_blocks, s.preemptions) == (0, 5, 32, 4)
    assert sched.on_step([StepOutput(i, 1) for i in running]) == []
    after = run(sched, fake, 200)  # the same fake: stale KV must be recomputed, not reused
    for seq_id, req in enumerate(reqs):
        got = before.outputs.get(seq_id, []) + after.outputs.get(seq_id, [])
        assert got == expect(sched, req)[0] and after.reasons[seq_id] == LENGTH


def test_config_is_validated():
    for bad in ({"max_seqs": 0}, {"max_batch_tokens": -1}, {"max_waiting": 1.5},
                {"max_model_len": True}, {"aging_steps": 0}, {"preempt_margin": 0},
                {"policy": "lottery"}, {"policy": 3}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)
    assert SchedulerConfig(policy="fcfs").policy is SchedPolicy.FCFS
    assert SchedulerConfig(aging_steps=None).aging_steps is None


def test_lazy_heap_orders_removes_and_compacts():
    h = LazyHeap()
    handles = {k: h.push((k % 7, k), k) for k in range(200)}
    assert len(h) == 200 and h.peek() == 0 and h.peek_key() == (0, 0)
    for k in range(200):
        if k % 3:
            assert h.remove(handles[k]) and not h.remove(handles[k])
    assert len(h) == 67 and len(h._heap) < 200  # rebuilt once dead outnumbered live
    want = sorted((k % 7, k) for k in range(200) if k % 3 == 0)
    assert [h.pop() for _ in range(len(h))] == [k for _, k in want]
    assert not h and not h.remove(handles[0])
    with pytest.raises(IndexError):
        h.peek()
    for item in "abc":
        h.push((0,), item)  # equal keys: push order, items never compared
    assert [h.pop() for _ in range(3)] == ["a", "b", "c"]


def test_a_sampling_row_without_output_runs_again():
    sched = make(16, 4, max_batch_tokens=16)
    a = sched.add(Request(prompt(5, 1), 3))
    first = sched.schedule()
    assert sched.on_step([]) == [] and sched.schedule() == first  # the chunk again
    sched.on_step([StepOutput(a, 8)])
    assert sched.schedule().decode == [a]
    sched.on_step([StepOutput(a + 1, 8)])  # nothing for a
    assert sched.schedule().decode == [a]
    assert sched.on_step([StepOutput(a, 9), StepOutput(a, 10)]) == [TokenEvent(a, 9)]
    assert list(sched.tokens(a)) == prompt(5, 1) + [8, 9]
