"""Embedding requests in the scheduler and the engine (docs/design/scheduler.md, "Embedding
requests"), on the null model: prefill only, chunked beside generation, pooled at the last
prompt position, finished "stop" with no token; preempted, aborted, cached and lost poolings;
and logs that replay verifies (their digests checked against the null model's vectors)."""
from __future__ import annotations

import sqlite3

import pytest

from core.blocks import FreeListBlocks
from core.ipc.protocol import SamplingParams
from core.prefill import Chunked
from core.sched import Finished, FinishReason, Request, Scheduler, SchedulerConfig, StepOutput
from core.steplog import StepLog
from replay.logfile import LogFile
from replay.verify import verify
from tests.core.test_overlap import engine, workload
from worker.null import NULL_HIDDEN, NullRunner, null_vector


def sched(blocks=64, max_batch_tokens=32, chunk=8, **kw) -> Scheduler:
    cfg = SchedulerConfig(max_batch_tokens=max_batch_tokens, max_model_len=512, **kw)
    return Scheduler(cfg, FreeListBlocks(16, range(blocks)), Chunked(chunk))


def test_an_embedding_is_chunked_pooled_once_and_finishes_stop_without_a_token():
    s = sched()
    e = s.add(Request(list(range(1, 21)), 1, embed=True))
    seen = []
    for _ in range(3):
        out = s.schedule()
        assert not any(ch.last for ch in out.prefill)   # never a sample row
        seen.append((out.prefill[0].start, out.prefill[0].length, list(out.pooled)))
        events = s.on_step([], pooled=out.pooled)
    assert seen == [(0, 8, []), (8, 8, []), (16, 4, [e])]
    assert events == [Finished(e, FinishReason.STOP)]
    assert not s.has_unfinished() and s.stats().free_blocks == 64


def test_embeddings_run_beside_decodes_in_the_same_steps():
    s = sched(max_batch_tokens=16, chunk=16)
    g = s.add(Request([5, 6, 7], 10))
    out = s.schedule()
    s.on_step([StepOutput(g, 9)])
    e = s.add(Request(list(range(1, 41)), 1, embed=True))
    steps = 0
    while s.tokens(e) is not None:
        out = s.schedule()
        assert out.decode == [g]            # the decode is never held back for the prefill
        s.on_step([StepOutput(g, 9)], pooled=out.pooled)
        steps += 1
    assert steps == 3   # 40 prompt tokens, 15 a step beside the decode


def test_a_pooled_chunk_without_its_vector_runs_again():
    s = sched()
    e = s.add(Request([1, 2, 3], 1, embed=True))
    out = s.schedule()
    assert out.pooled == [e]
    assert s.on_step([]) == []              # the worker lost it: no finish
    out = s.schedule()
    assert [(c.start, c.length) for c in out.prefill] == [(0, 3)] and out.pooled == [e]


def test_a_one_token_remainder_is_pooled_not_decoded():
    """A prompt whose last chunk is one token would look like a decode (d == 1)."""
    s = sched(chunk=4)
    e = s.add(Request([1, 2, 3, 4, 5], 1, embed=True))
    s.on_step([], pooled=s.schedule().pooled)
    out = s.schedule()
    assert out.decode == [] and [(c.start, c.length) for c in out.prefill] == [(4, 1)]
    assert out.pooled == [e]


def test_an_aborted_embedding_is_not_finished_by_its_vector():
    s = sched()
    e = s.add(Request([1, 2, 3], 1, embed=True))
    out = s.schedule()
    s.abort(e)
    assert s.on_step([], pooled=out.pooled) == [] and s.stats().finished == 1


def run_engine(eng, gens, embeds):
    ids = [eng.add(Request(p, n), sp, ignore_eos=True) for p, n, sp in gens]
    emb = [eng.add(Request(p, 1, embed=True)) for p in embeds]
    vectors, reasons, tokens = {}, {}, {}
    while eng.busy():
        done = eng.step()
        vectors.update({i: list(v) for i, v in done.embeddings})
        for ev in done.events:
            if isinstance(ev, Finished):
                reasons[ev.id] = ev.reason.value
            else:
                tokens.setdefault(ev.id, []).append(ev.token)
    return ids, emb, vectors, reasons, tokens


PROMPTS = [[7], [3, 4], list(range(1, 17)), list(range(1, 18)), list(range(2, 60)),
           [9] * 100]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_vectors_are_the_models_at_the_last_prompt_position(tmp_path, overlap, prefix_cache):
    path = tmp_path / "e.db"
    eng = engine(NullRunner(), overlap, path, prefix_cache=prefix_cache)
    ids, emb, vectors, reasons, tokens = run_engine(eng, workload(8), PROMPTS + PROMPTS)
    eng.log.close()
    for i, p in zip(emb, PROMPTS + PROMPTS):
        assert vectors[i] == pytest.approx(null_vector(p[-1], len(p) - 1), abs=1e-6)
        assert reasons[i] == "stop" and i not in tokens
    alone_ids, _, _, _, alone = run_engine(engine(NullRunner(), overlap), workload(8), [])
    assert [tokens[i] for i in ids] == [alone[i] for i in alone_ids]   # generation unchanged
    log = LogFile(str(path))
    assert verify(log).ok and verify(log, NullRunner()).ok
    rows = sqlite3.connect(path).execute("SELECT request_id, dims FROM embeddings").fetchall()
    assert sorted(rows) == sorted((i, NULL_HIDDEN) for i in emb)
    out = sqlite3.connect(path).execute(
        "SELECT output_tokens, finish_reason FROM requests WHERE id = ?", (emb[0],)).fetchone()
    assert out == ("[]", "stop")


class Shifted(NullRunner):
    """The null model with every pooled vector's first float changed."""

    def run(self, batch):
        out = super().run(batch)
        if len(out.pooled):
            out.pooled[0] += 0.5
        return out


def test_replay_with_the_model_finds_a_vector_that_differs(tmp_path):
    path = tmp_path / "e.db"
    eng = engine(NullRunner(), False, path)
    run_engine(eng, workload(2), PROMPTS[:2])
    eng.log.close()
    verdict = verify(LogFile(str(path)), Shifted())
    assert not verdict.ok and verdict.divergence.what == "embeddings"


@pytest.mark.parametrize("overlap", [False, True])
def test_preempted_and_restarted_embeddings_still_finish(overlap):
    eng = engine(NullRunner(num_blocks=12), overlap)
    gens = [(list(range(1, 30)), 40, SamplingParams()) for _ in range(3)]
    ids, emb, vectors, reasons, _ = run_engine(eng, gens, PROMPTS[2:5])
    assert set(vectors) == set(emb) and all(reasons[i] == "stop" for i in emb)
    eng = engine(NullRunner(), overlap)
    emb = [eng.add(Request(p, 1, embed=True)) for p in PROMPTS]
    got = {i: list(v) for i, v in eng.step().embeddings}
    assert len(got) < len(emb)
    eng.restart()   # a new worker: every running request recomputes
    while eng.busy():
        got.update({i: list(v) for i, v in eng.step().embeddings})
    assert set(got) == set(emb)


def test_an_embedding_cannot_ask_for_prompt_logprobs():
    eng = engine(NullRunner(), False)
    with pytest.raises(Exception, match="embedding"):
        eng.add(Request([1, 2], 1, embed=True), SamplingParams(prompt_logprobs=1))
