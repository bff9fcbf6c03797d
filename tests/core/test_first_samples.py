"""core/first_samples.py through build_batch: a constrained request's spec comes with its first
sample since it was (re)admitted, whether that row is a prefill's last chunk or a decode
that follows a chunk ending one token short."""
from __future__ import annotations

from core.batch import build_batch, sampled_ids
from core.first_samples import FirstSamples
from core.ipc.protocol import Constraint, SamplingParams
from core.sched import Chunked, FreeListBlocks, Request, Scheduler, SchedulerConfig, StepOutput
from tests.table_traffic import BS, traffic


def _own_constraint(seq_id: int) -> SamplingParams:
    return SamplingParams(constraint=Constraint("regex", f"r{seq_id}"))


def _spec_rows(batch) -> set[int]:
    keys = {key for key, _, _ in batch.grammar_specs}
    return {int(batch.seq_ids[r]) for r, k in zip(batch.sample_rows, batch.grammar) if k in keys}


def test_a_prompt_one_token_past_a_chunk_gets_its_spec_on_the_decode():
    sched = Scheduler(SchedulerConfig(max_batch_tokens=64), FreeListBlocks(BS, range(32)),
                      Chunked(8))
    a = sched.add(Request(list(range(1, 10)), 4))   # 9 tokens: a chunk of 8, then a decode
    sampling, firsts = {a: _own_constraint(a)}, FirstSamples()
    specs = []
    for step in range(3):
        out = sched.schedule()
        specs.append(_spec_rows(build_batch(step, out, sched, sampling, None, None, firsts)))
        sched.on_step([StepOutput(i, 5) for i in sampled_ids(out)])
        if step == 0:
            assert sampled_ids(out) == []
        if step == 1:
            assert out.decode == [a]   # the prompt's last token, queried as a decode
    assert specs == [set(), {a}, set()]


def test_every_first_sample_since_admission_carries_its_spec():
    """Random traffic that preempts and recomputes, chunks cut by the token budget: a row
    carries its spec exactly when its request has not sampled since its chunk at 0 (its
    admission; the pool caches nothing). Some of them are decodes."""
    firsts, sampled, decode_firsts, checked = FirstSamples(), {}, 0, 0
    for step, sched, out in traffic(FreeListBlocks, seed=3):
        if out is None:
            continue
        for ch in out.prefill:
            if ch.start == 0:
                sampled[ch.id] = False
        sampling = {i: _own_constraint(i) for i in sched.unfinished()}
        batch = build_batch(step, out, sched, sampling, None, None, firsts)
        ids = sampled_ids(out)
        assert _spec_rows(batch) == {i for i in ids if not sampled[i]}, step
        decode_firsts += sum(not sampled[i] for i in out.decode)
        checked += len(ids)
        sampled.update((i, True) for i in ids)
    assert decode_firsts and checked > 100
