"""Penalties, min_tokens bans, min_p and logprobs (worker/processors.py, worker/sampler.py),
on synthetic logits against plain-Python references, then end to end on the tiny model."""
from __future__ import annotations

import math

import pytest
import torch

from core.ipc.protocol import SamplingParams
from worker.handmade import Part, make_batch
from worker.load import make_runner, resolve_model
from worker.null import NullRunner, null_token
from worker.preset_tokenizer import EOS_ID
from worker.processors import process
from worker.sampler import SampleParams, sample, sample_step

V = 40


def batch_of(histories, params, gens=None, banned=None):
    """One decode-like part per row, the row's history being its tokens so far."""
    gens = gens or [0] * len(histories)
    banned = banned or [()] * len(histories)
    return make_batch([Part(h, len(h) - 1, 1, list(range(8)), params=p, gen_index=g, banned=b)
                       for h, p, g, b in zip(histories, params, gens, banned)], 16)


def randn(rows, vocab=V, seed=0, scale=3.0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def reference(logits, histories, params, gens):
    """The penalties in loops over Python floats, in vLLM's order."""
    out = logits.double().tolist()
    for row, h, p, g in zip(out, histories, params, gens):
        if not p.penalized:
            continue
        generated = h[len(h) - g:]
        for t in set(h):
            r = p.repetition_penalty
            row[t] = row[t] / r if row[t] > 0 else row[t] * r
        for t in set(generated):
            row[t] -= p.frequency_penalty * generated.count(t) + p.presence_penalty
    return torch.tensor(out, dtype=torch.float64)


HISTORIES = [[1, 2, 3, 3, 5, 5, 5, 7], [4, 4, 9, 1], [0, 1, 2, 3, 1, 1, 39], [6, 6, 6, 6, 2],
             [11, 12, 11, 13, 12, 11], [8, 9]]
PENALTIES = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.7),
             SamplingParams(),
             SamplingParams(repetition_penalty=0.8),
             SamplingParams(frequency_penalty=-0.4),
             SamplingParams(presence_penalty=1.5, temperature=1.0, seed=3),
             SamplingParams(frequency_penalty=2.0, repetition_penalty=1.5)]
GENS = [5, 0, 3, 4, 3, 0]


@pytest.mark.parametrize("rows", [range(6), [1, 2], [3, 1], [4]])
def test_penalties_match_a_loop_reference(rows):
    histories, params = [HISTORIES[j] for j in rows], [PENALTIES[j] for j in rows]
    gens = [GENS[j] for j in rows]
    logits = randn(len(rows))
    got = process(logits, batch_of(histories, params, gens))
    assert torch.allclose(got.double(), reference(logits, histories, params, gens), atol=1e-5)
    for j, p in enumerate(params):
        assert torch.equal(got[j], logits[j]) != p.penalized   # rows without are untouched


def test_the_fast_path_returns_the_logits_themselves():
    logits = randn(3)
    batch = batch_of([[1, 2]] * 3, [SamplingParams(), SamplingParams(temperature=1.0),
                                     SamplingParams(min_p=0.1, temperature=1.0)])
    assert process(logits, batch) is logits


def test_banned_ids_are_never_chosen():
    logits = torch.arange(V, dtype=torch.float32).repeat(200, 1)   # best ids last
    banned = list(range(V - 5, V))
    params = [SamplingParams(temperature=0.0 if j < 20 else 3.0, seed=j) for j in range(200)]
    batch = batch_of([[1, 2]] * 200, params, gens=list(range(200)), banned=[banned] * 200)
    tokens, _ = sample_step(logits, batch)
    assert tokens[:20].tolist() == [V - 6] * 20
    assert not set(tokens.tolist()) & set(banned) and len(set(tokens[20:].tolist())) > 3


def test_null_runner_steps_over_banned_ids_and_eos():
    r = NullRunner(num_blocks=8)
    t = null_token(7, 2, 512)
    part = Part([5, 6, 7], 0, 3, [0], banned=[t, t + 1, EOS_ID])
    (got,) = r.execute(make_batch([part], 16))
    want = t + 2 if t + 2 != EOS_ID else t + 3
    assert got == want and r.logits(make_batch([part], 16)).argmax(-1).tolist() == [got]


def test_min_p_restricts_the_support():
    logits = randn(1, 100, seed=1, scale=2.0).repeat(300, 1)
    n = len(logits)
    p = SampleParams(torch.full((n,), 2.0, dtype=torch.float64), torch.ones(n, dtype=torch.float64),
                     torch.zeros(n, dtype=torch.int32), torch.full((n,), 9, dtype=torch.int64),
                     torch.arange(n, dtype=torch.int32), torch.full((n,), 0.2, dtype=torch.float64))
    probs = (logits[0] / 2.0).softmax(-1)
    support = set((probs >= 0.2 * probs.max()).nonzero().flatten().tolist())
    got = set(sample(logits, p).tolist())
    assert got <= support and len(got) > 1 and len(support) < 20
    off = SampleParams(p.temperature, p.top_p, p.top_k, p.seeds, p.gen_index)
    p.min_p = torch.zeros(n, dtype=torch.float64)   # a column of zeros changes nothing
    assert torch.equal(sample(logits, p), sample(logits, off))


def test_seeded_samples_are_unchanged_without_the_new_fields():
    """Pinned with the sampler before the logits processors existed."""
    logits = randn(6, 300, seed=123)
    p = SampleParams(torch.tensor([0.7, 1.0, 1.3, 0.0, 0.9, 2.0], dtype=torch.float64),
                     torch.tensor([1.0, 0.9, 0.8, 1.0, 1.0, 0.95], dtype=torch.float64),
                     torch.tensor([0, 0, 40, 0, 7, 100], dtype=torch.int32),
                     torch.tensor([1, 2, 3, 4, -5, 2**62], dtype=torch.int64),
                     torch.tensor([0, 5, 9, 1, 33, 1000], dtype=torch.int32))
    assert sample(logits, p).tolist() == [186, 172, 129, 68, 237, 283]
    params = [SamplingParams(temperature=float(p.temperature[j]), top_p=float(p.top_p[j]),
                             top_k=int(p.top_k[j]), seed=int(p.seeds[j])) for j in range(6)]
    gens = p.gen_index.tolist()
    plain = batch_of([[1]] * 6, params, gens)
    assert sample_step(logits, plain)[0].tolist() == [186, 172, 129, 68, 237, 283]
    asking = [SamplingParams(**{**vars(s), "logprobs": 2}) for s in params]
    assert sample_step(logits, batch_of([[1]] * 6, asking, gens))[0].tolist() == \
        [186, 172, 129, 68, 237, 283]


def test_logprobs_are_the_log_softmax_of_the_processed_logits():
    logits = randn(5, seed=4)
    logits[3, :6] = 20.0   # ties: the alternatives go by id
    histories = [[1, 2, 2], [3], [4, 5], [0, 1], [6, 6, 7]]
    params = [SamplingParams(logprobs=3, repetition_penalty=1.2, frequency_penalty=0.3),
              SamplingParams(),
              SamplingParams(logprobs=0, temperature=1.0, seed=1, min_p=0.05),
              SamplingParams(logprobs=4),
              SamplingParams(logprobs=20, temperature=0.7, top_k=5, seed=2, presence_penalty=1)]
    gens = [2, 0, 1, 0, 2]
    banned = [(), (), (7,), (), (8, 9)]
    batch = batch_of(histories, params, gens, banned)
    tokens, lp = sample_step(logits, batch)
    want = process(logits, batch).log_softmax(-1)
    chosen = list(lp.chosen)
    assert math.isnan(chosen[1])
    for j in (0, 2, 3, 4):
        assert chosen[j] == pytest.approx(float(want[j, tokens[j]]), abs=1e-6)
    assert math.isinf(want[4, 8]) and want[4].argmax() != 8
    ks = [3, 0, 4, 20]
    assert len(lp.top_ids) == len(lp.top_logprobs) == sum(ks)
    ids, vals, at = list(lp.top_ids), list(lp.top_logprobs), 0
    for j, k in zip((0, 2, 3, 4), ks):
        order = sorted(range(V), key=lambda i: (-float(want[j, i]), i))[:k]
        assert ids[at:at + k] == order
        assert vals[at:at + k] == pytest.approx([float(want[j, i]) for i in order], abs=1e-6)
        at += k
    assert ids[3:7] == [0, 1, 2, 3]
    assert tokens[0] == want[0].argmax() and tokens[3] == 0


def test_no_logprob_columns_when_no_row_asks():
    _, lp = sample_step(randn(2), batch_of([[1], [2]], [SamplingParams()] * 2))
    assert (len(lp.chosen), len(lp.top_ids), len(lp.top_logprobs)) == (0, 0, 0)


def test_null_runner_run_shapes():
    r = NullRunner(num_blocks=8)
    parts = [Part([5, 6, 7], 0, 3, [0], params=SamplingParams(logprobs=k)) for k in (None, 0, 4)]
    batch = make_batch(parts, 16, step=3)
    res = r.run(batch)
    t = list(res.tokens)
    assert res.step == 3 and t == list(r.execute(batch))
    assert math.isnan(res.logprobs[0]) and list(res.logprobs)[1:] == [0.0, 0.0]
    others = [i for i in range(4) if i != t[2]][:3]
    assert list(res.top_ids) == [t[2], *others]
    assert list(res.top_logprobs) == [0.0, -math.inf, -math.inf, -math.inf]
    _, lp = sample_step(r.logits(batch), batch)   # what a real runner makes of one-hot logits
    assert (lp.top_ids, lp.top_logprobs) == (res.top_ids, res.top_logprobs)
    plain = r.run(make_batch([Part([5, 6, 7], 0, 3, [0])], 16))
    assert (len(plain.tokens), len(plain.logprobs), len(plain.top_ids)) == (1, 0, 0)


def test_tiny_model_logprobs_match_transformers():
    from transformers import AutoModelForCausalLM

    runner = make_runner("tiny", num_blocks=8)
    prompt, table, steps = [3, 14, 15, 92, 65, 35], list(range(8)), 4
    params = SamplingParams(logprobs=5, temperature=0.9, seed=11)
    tokens, got, tops = list(prompt), [], []
    for g in range(steps):
        start = 0 if g == 0 else len(tokens) - 1
        part = Part(tokens, start, len(tokens) - start, table, params=params, gen_index=g)
        res = runner.run(make_batch([part], runner.info.block_size))
        tokens.append(res.tokens[0])
        got.append(res.logprobs[0])
        tops.append((list(res.top_ids), list(res.top_logprobs)))
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), attn_implementation="sdpa")
    with torch.no_grad():
        lps = hf(torch.tensor([tokens])).logits[0].float().log_softmax(-1)
    for g in range(steps):
        row = lps[len(prompt) - 1 + g]
        assert got[g] == pytest.approx(float(row[tokens[len(prompt) + g]]), abs=1e-4)
        ids, vals = tops[g]
        assert ids == row.topk(5).indices.tolist()
        assert vals == pytest.approx(row.topk(5).values.tolist(), abs=1e-4)


def test_a_draw_rounding_up_to_one_stays_among_the_kept_tokens(monkeypatch):
    """float32(u) may be 1.0 and u * total the total: the pick once ran past the kept prefix
    to the last-ranked token (banned, or outside top_k)."""
    monkeypatch.setattr("worker.sampler.uniform", lambda seed, index: 1 - 1e-12)
    logits = torch.arange(V, dtype=torch.float32)[None, :]
    p = SampleParams(torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                     torch.tensor([3], dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                     torch.zeros(1, dtype=torch.int32))
    assert sample(logits, p).tolist() == [V - 3]
