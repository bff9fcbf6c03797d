"""Prompt logprobs (docs/design/worker.md, "Prompt logprobs") through the real scheduler, engine
and worker on the tiny preset: equal to transformers' log_softmax over the same prompt,
whole, in chunks and in a batch; each position once across preemption and the prefix cache;
and a step log whose prompt logprobs `replay verify --with-model` checks."""
from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.config import CoreConfig, log_meta
from core.engine import Engine
from core.ipc.protocol import SamplingParams
from core.overlap import OverlapEngine
from core.sched import (Chunked, FreeListBlocks, PrefixCacheBlocks, Request, Scheduler,
                        SchedulerConfig)
from core.steplog import StepLog
from replay.logfile import LogFile
from replay.verify import verify
from worker.load import make_runner, resolve_model
from worker import native
from worker.null import NullRunner

TOP = 3


@pytest.fixture(scope="module")
def runner():
    return make_runner("tiny", num_blocks=128)


@pytest.fixture(scope="module")
def stock():
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), attn_implementation="sdpa")


def prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def engine(runner, *, max_chunk=None, prefix=False, num_blocks=None, max_seqs=16,
           overlap=False, max_batch_tokens=512, log=None):
    info = runner.info
    cfg = SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=max_batch_tokens,
                          max_model_len=info.max_model_len)
    ids = range(num_blocks or info.num_blocks)
    blocks = (PrefixCacheBlocks(info.block_size, ids) if prefix
              else FreeListBlocks(info.block_size, ids))
    sched = Scheduler(cfg, blocks, Chunked(max_chunk) if max_chunk else None)
    cls = OverlapEngine if overlap else Engine
    return cls(sched, runner, eos_ids=info.eos_ids, log=log)


def collect(eng, reqs, top=TOP) -> dict[int, dict[int, list]]:
    """Run reqs [(prompt, max_tokens)] to the end: seq_id -> {position: entry}, failing on
    a position delivered twice."""
    ids = [eng.add(Request(list(p), n), SamplingParams(prompt_logprobs=top), ignore_eos=True)
           for p, n in reqs]
    got: dict[int, dict[int, list]] = {i: {} for i in ids}
    while eng.busy():
        for seq_id, first, entries in eng.step().prompt_logprobs:
            for k, e in enumerate(entries if seq_id in got else ()):
                assert first + k not in got[seq_id], f"position {first + k} sent twice"
                got[seq_id][first + k] = e
    return [got[i] for i in ids]


def reference(stock, prompt) -> torch.Tensor:
    """transformers' log_softmax of the logits over the prompt: row p - 1 scores token p."""
    with torch.inference_mode():
        logits = stock(torch.tensor([prompt])).logits[0].float()
    return logits.log_softmax(-1)


def check_against(stock, prompt, got: dict, top=TOP) -> None:
    ref = reference(stock, prompt)
    assert sorted(got) == list(range(1, len(prompt)))
    for p, (lp, rank, alts) in got.items():
        want = ref[p - 1]
        assert abs(lp - float(want[prompt[p]])) < 1e-4, p
        assert rank == int((want > want[prompt[p]]).sum()) + 1 or abs(
            float(want.sort(descending=True).values[rank - 1]) - lp) < 1e-5
        assert len(alts) == top
        best = want.topk(top)
        for (tid, tlp), v in zip(alts, best.values):
            assert abs(tlp - float(v)) < 1e-4 and abs(float(want[tid]) - tlp) < 1e-4


@pytest.mark.parametrize("max_chunk", [None, 7])
def test_prompt_logprobs_match_transformers(runner, stock, max_chunk):
    """Whole and chunked (7-token chunks split the 40-token prompt), alone and batched with
    requests that do not ask (max_batch_tokens 24 interleaves their chunks)."""
    vocab = runner.info.vocab_size
    p, *others = prompts(vocab, (40, 30, 5, 17), seed=1)
    (got,) = collect(engine(runner, max_chunk=max_chunk), [(p, 2)])
    check_against(stock, p, got)
    eng = engine(runner, max_chunk=max_chunk, max_batch_tokens=24)
    for o in others:
        eng.add(Request(o, 6), SamplingParams(), ignore_eos=True)
    mixed = collect(eng, [(p, 2), (others[0], 3)])
    check_against(stock, p, mixed[0])
    check_against(stock, others[0], mixed[1])


def test_one_token_prompt_has_none_and_zero_top_gives_no_alternatives(runner, stock):
    vocab = runner.info.vocab_size
    short, p = prompts(vocab, (1, 9), seed=2)
    got = collect(engine(runner), [(short, 2), (p, 1)], top=0)
    assert got[0] == {}
    assert sorted(got[1]) == list(range(1, 9)) and all(e[2] == [] for e in got[1].values())
    check_against(stock, p, got[1], top=0)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_cached_prompt_still_gets_every_position(runner, stock, overlap):
    """The prompt's blocks are cached by a first request; one asking for prompt logprobs
    takes no hit and gets every position; one not asking still hits."""
    vocab = runner.info.vocab_size
    (p,) = prompts(vocab, (50,), seed=3)
    eng = engine(runner, prefix=True, overlap=overlap)
    eng.add(Request(list(p), 2), SamplingParams(), ignore_eos=True)
    eng.run()
    (got,) = collect(eng, [(p, 2)])
    check_against(stock, p, got)
    assert eng.sched.blocks.prefix_hit_tokens == 0
    eng.add(Request(list(p), 2), SamplingParams(), ignore_eos=True)
    eng.run()
    assert eng.sched.blocks.prefix_hit_tokens >= 48   # the blocks were cached for others


@pytest.mark.parametrize("overlap", [False, True])
def test_preemption_neither_repeats_nor_mixes_positions(overlap):
    """Few blocks: requests preempt each other mid-prefill and after it and recompute;
    every position comes once and equals a run alone (the null model's scores)."""
    runner = NullRunner(num_blocks=14, block_size=4)
    reqs = [(p, 12) for p in prompts(runner.info.vocab_size, (17, 23, 9, 30), seed=4)]
    alone = [collect(engine(runner, max_chunk=5), [r])[0] for r in reqs]
    eng = engine(runner, max_chunk=5, overlap=overlap)
    got = collect(eng, reqs)
    assert eng.sched.stats().preemptions > 0
    assert got == alone
    assert [sorted(g) for g in got] == [list(range(1, len(p))) for p, _ in reqs]


@pytest.mark.parametrize("overlap", [False, True])
def test_preempted_mid_prompt_recomputes_without_resending(overlap):
    """B's 30-token prompt goes in 2-token chunks; A, admitted first, grows into B's blocks
    and preempts B partway through its prompt; B recomputes from position 0 later and
    still gets each position once, the same as alone."""
    runner = NullRunner(num_blocks=11, block_size=4)
    a, b = prompts(runner.info.vocab_size, (4, 30), seed=5)
    alone = collect(engine(runner, max_chunk=2), [(b, 2)])[0]
    eng = engine(runner, max_chunk=2, overlap=overlap)
    eng.add(Request(a, 36), SamplingParams(), ignore_eos=True)
    seen_before_preemption = []
    orig = eng.sched.schedule

    def schedule():
        out = orig()
        if out.preempted:
            seen_before_preemption.append(len(got_so_far))
        return out

    got_so_far: list = []
    values = {}
    eng.sched.schedule = schedule
    ids = eng.add(Request(b, 2), SamplingParams(prompt_logprobs=TOP), ignore_eos=True)
    while eng.busy():
        for seq_id, first, entries in eng.step().prompt_logprobs:
            assert seq_id == ids
            got_so_far.extend(range(first, first + len(entries)))
            values.update(zip(range(first, first + len(entries)), entries))
    assert seen_before_preemption and 0 < seen_before_preemption[0] < len(b) - 1
    assert got_so_far == list(range(1, len(b)))
    assert values == alone


def record_log(runner, path, overlap: bool) -> None:
    """Chunked prompts asking for prompt logprobs (and one not asking), with the prefix
    cache on and a small pool, logged."""
    cfg = CoreConfig("-", "-", "-", "-", max_seqs=4, max_batch_tokens=32, max_chunk=8,
                     prefix_cache=True, overlap=overlap)
    info = replace(runner.info, num_blocks=20)
    log = StepLog(str(path), log_meta(cfg, info))
    eng = cfg.make_engine(info, log)
    eng.runner = runner
    vocab = info.vocab_size
    try:
        for k, p in enumerate(prompts(vocab, (37, 20, 37, 12), seed=6)):
            top = None if k == 3 else k
            eng.add(Request(p, 5), SamplingParams(prompt_logprobs=top), ignore_eos=True)
        eng.run()
    finally:
        log.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_replay_with_the_model_checks_prompt_logprobs(runner, tmp_path, overlap):
    path = tmp_path / "plp.db"
    record_log(runner, path, overlap)
    log = LogFile(str(path))
    logged = log.prompt_logprobs()
    assert sum(len(e) for step in logged.values() for _, e in step.values()) == 36 + 19 + 36
    assert verify(log, runner).ok and verify(LogFile(str(path))).ok
    step = sorted(logged)[1]
    seq_id, (first, entries) = next(iter(logged[step].items()))
    entries[-1][0] += 1e-6
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE prompt_logprobs SET entries=? WHERE step=? AND request_id=?",
                     (json.dumps(entries), step, seq_id))
    v = verify(LogFile(str(path)), runner)
    assert (v.divergence.step, v.divergence.what) == (step, "prompt_logprobs")
    assert f"position {first + len(entries) - 1}" in v.divergence.diffs[0]
    assert verify(LogFile(str(path))).ok   # without the model only the schedule counts


@pytest.mark.skipif(native.kernel() is None,
                    reason="no C compiler: the batch-invariant mode needs the C attention kernel")
def test_batch_invariant_prompt_logprobs_are_bitwise_equal_in_any_batch():
    """docs/design/cpu-paths.md, "Batch-invariant mode": alone and whole vs chunked (7) inside a
    batch of 12 other requests, some asking too."""
    inv = make_runner("tiny", num_blocks=160, batch_invariant=True)
    vocab = inv.info.vocab_size
    mine = prompts(vocab, (45, 23), seed=7)
    alone = [collect(engine(inv), [(p, 3)])[0] for p in mine]
    eng = engine(inv, max_chunk=7, max_batch_tokens=40)
    for k, o in enumerate(prompts(vocab, [5 + 3 * k for k in range(12)], seed=8)):
        eng.add(Request(o, 4 + k % 3), SamplingParams(prompt_logprobs=k % 2 or None),
                ignore_eos=True)
    mixed = collect(eng, [(p, 3) for p in mine])
    assert mixed == alone   # exact floats: bitwise


def test_scores_on_synthetic_logits_and_bad_columns_refused():
    """Ranks count the more likely tokens; ties among the alternatives go by id; more than
    ROWS_AT_ONCE rows come out in order; columns that do not hang together are a
    ValueError before any forward."""
    from core.ipc.protocol import I32
    from worker import prompt_scores
    n, vocab = prompt_scores.ROWS_AT_ONCE + 3, 11
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
    logits[0] = torch.tensor([0.0, 2.0, 2.0, 1.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    targets = [3] + [k % vocab for k in range(1, n)]
    tops = [3] + [k % 4 for k in range(1, n)]
    b = make_empty_batch(n)
    b.prompt_targets, b.prompt_top = I32(targets), I32(tops)
    got = prompt_scores.score(logits, b)
    ref = logits.log_softmax(-1)
    assert list(got.ranks)[0] == 4 and list(got.top_ids)[:3] == [1, 2, 4]
    for m in range(n):
        assert got.logprobs[m] == float(ref[m, targets[m]])
        assert got.ranks[m] == int((ref[m] > ref[m, targets[m]]).sum()) + 1
    assert len(got.top_ids) == len(got.top_logprobs) == sum(tops)
    prompt_scores.check(b, vocab)
    for name, bad in (("prompt_targets", I32(targets[:-1])), ("prompt_targets", I32([vocab] * n)),
                      ("prompt_top", I32([vocab + 1] * n)), ("prompt_top", I32([-1] * n))):
        c = make_empty_batch(n)
        c.prompt_targets, c.prompt_top = I32(targets), I32(tops)
        setattr(c, name, bad)
        with pytest.raises(ValueError):
            prompt_scores.check(c, vocab)


def make_empty_batch(n: int):
    """A one-sequence batch of n tokens whose every token is a prompt row."""
    from core.ipc.protocol import I32
    from worker.handmade import Part, make_batch
    b = make_batch([Part(list(range(n + 1)), 0, n, list(range(n // 16 + 2)))], 16)
    b.prompt_rows = I32(range(n))
    return b


@pytest.mark.parametrize("folder", ["", "format2"])
def test_logs_from_before_prompt_logprobs_replay_with_the_model(tmp_path, folder):
    """The golden logs have no prompt_logprobs table: read as none, and they verify with
    the model they were recorded with (the null model)."""
    import shutil

    from replay.record import SCENARIOS
    from tests import FIXTURES
    src = FIXTURES / folder / "golden_aborts.db"
    path = tmp_path / "golden.db"
    shutil.copy(src, path)
    log = LogFile(str(path))
    assert "prompt_logprobs" not in log._tables() and log.prompt_logprobs() == {}
    info = SCENARIOS["aborts"].info
    assert verify(log, NullRunner(num_blocks=info.num_blocks, block_size=info.block_size)).ok


def test_what_if_keeps_prompt_logprob_requests_off_the_cache(runner, tmp_path):
    """A what-if simulation of a log runs its prompt-logprob requests without cache hits,
    as the engine did."""
    from replay.timeline import recorded
    from replay.trace import from_log, scaled
    path = tmp_path / "plp.db"
    record_log(runner, path, overlap=False)
    log = LogFile(str(path))
    reqs = scaled(from_log(log, recorded(log)), 2.0)
    assert [r.cache_hits for r in reqs] == [False, False, False, True]


@pytest.fixture(scope="module")
def plp_log(runner, tmp_path_factory):
    path = tmp_path_factory.mktemp("plp") / "plp.db"
    record_log(runner, path, overlap=False)
    with sqlite3.connect(path) as conn:   # one self-contained file, no -wal beside it
        conn.execute("PRAGMA journal_mode=DELETE")
    return path


@pytest.mark.parametrize("entries", ['"x"', "[[0.5, 0, []]]", "[[0.5, 1, [[1]]]]", "[1]",
                                     "not json"])
def test_a_damaged_prompt_logprobs_row_is_a_damaged_log(plp_log, tmp_path, capsys, entries):
    import shutil

    from replay.__main__ import main as replay_main
    from replay.damage import DamagedLog
    path = tmp_path / "plp.db"
    shutil.copy(plp_log, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE prompt_logprobs SET entries=? WHERE rowid=1", (entries,))
    with pytest.raises(DamagedLog, match="prompt logprobs of step"):
        LogFile(str(path)).prompt_logprobs()
    assert replay_main(["verify", "--with-model", str(path)]) == 2
    assert "damaged step log" in capsys.readouterr().err
