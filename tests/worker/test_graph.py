"""The decode graph (worker/graph.py, docs/design/cpu-paths.md "The decode graph"): one recording of a
pure-decode forward answers bit for bit as the eager forward does at any row count and
context, generates what transformers' generate does, leaves other steps eager, and is
refused (the runner stays eager) where it cannot be made or answers differently."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from worker import graph, native
from worker.handmade import Part, make_batch
from worker.load import make_runner
from worker.step import build_step

from tests.checkpoints import make_checkpoint
from tests.worker.test_worker_engine import prompts, stock_greedy

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: no C kernel, so no decode graph")

VOCAB = 320


@pytest.fixture(scope="module")
def d64_dir(tmp_path_factory):
    """Head dim 64 (the C kernel's), 2 query heads per KV head, q/k/v and gate/up fused."""
    return make_checkpoint(tmp_path_factory, "g64", 11, {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 384,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": VOCAB}, init_std=0.1)


@pytest.fixture(scope="module")
def runner(d64_dir):
    r = make_runner(str(d64_dir), num_blocks=160)
    assert r.graph is not None
    return r


def eager(r, batch):
    g, r.graph = r.graph, None
    try:
        return r.logits(batch)
    finally:
        r.graph = g


def prefilled(r, seqs, seed):
    """Tables in scattered blocks with room for 8 more tokens each; every token but the
    last of each sequence prefilled."""
    free = list(range(r.info.num_blocks))
    random.Random(seed).shuffle(free)
    tables = []
    for s in seqs:
        tables.append(free[:-(-(len(s) + 8) // 16)])
        free = free[len(tables[-1]):]
    r.execute(make_batch([Part(s, 0, len(s) - 1, t, sample=False)
                          for s, t in zip(seqs, tables)], 16))
    return tables


@pytest.mark.parametrize("lengths", [[1], [37], [5, 200, 16], [3, 4, 5, 6, 7, 8, 9, 100]])
def test_graph_logits_equal_eager_bit_for_bit(runner, lengths):
    seqs = prompts(VOCAB, lengths, seed=len(lengths))
    tables = prefilled(runner, seqs, len(lengths))
    decode = make_batch([Part(s, len(s) - 1, 1, t) for s, t in zip(seqs, tables)], 16)
    s = build_step(decode, runner.kv, runner.native, runner.windows)
    assert graph.DecodeGraph.takes(s)
    assert torch.equal(runner.logits(decode), eager(runner, decode))


def test_batched_decode_through_the_graph_matches_transformers_generate(runner, d64_dir):
    """Three prompts decoded together, every decode step through the graph."""
    stock = AutoModelForCausalLM.from_pretrained(d64_dir, attn_implementation="sdpa")
    ps = prompts(VOCAB, (3, 40, 130), seed=5)
    seqs = [list(p) for p in ps]
    tables = prefilled(runner, seqs, 0)
    calls = []
    fn = runner.graph.fn
    runner.graph.fn = lambda *a: calls.append(1) or fn(*a)
    try:
        out = [[] for _ in ps]
        for i in range(8):
            b = make_batch([Part(s, len(s) - 1, 1, t, gen_index=i)
                            for s, t in zip(seqs, tables)], 16)
            for s, o, tok in zip(seqs, out, runner.execute(b)):
                s.append(tok)
                o.append(tok)
    finally:
        runner.graph.fn = fn
    assert len(calls) == 8
    assert out == [stock_greedy(stock, p, 8) for p in ps]


def test_steps_with_a_prefill_stay_eager(runner):
    seqs = prompts(VOCAB, (20, 30), seed=9)
    tables = prefilled(runner, seqs, 9)
    mixed = make_batch([Part(seqs[0], 19, 1, tables[0]), Part(seqs[1], 10, 20, tables[1])], 16)
    s = build_step(mixed, runner.kv, runner.native, runner.windows)
    assert not graph.DecodeGraph.takes(s)


def test_tl_graph_0_keeps_the_runner_eager(d64_dir, monkeypatch):
    monkeypatch.setenv("TL_GRAPH", "0")
    assert make_runner(str(d64_dir), num_blocks=16).graph is None


def test_a_graph_that_answers_differently_is_refused(runner, monkeypatch, capsys):
    real = runner.eager_logits
    monkeypatch.setattr(runner, "eager_logits", lambda s: real(s) + 1e-6)
    assert graph.capture(runner, runner.graph.weights) is None
    assert "differ from the eager forward's at 1 rows" in capsys.readouterr().err


def test_a_recording_that_fails_leaves_the_runner_eager(runner, monkeypatch, capsys):
    def refuse(*a, **k):
        raise RuntimeError("no recorder here")
    monkeypatch.setattr(torch.jit, "trace", refuse)
    assert graph.capture(runner, runner.graph.weights) is None
    assert "decode graph unavailable, running eager: no recorder here" in capsys.readouterr().err


D64 = {"hidden_size": 256, "intermediate_size": 384, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB}


@pytest.mark.parametrize("family,config,bias", [
    ("qwen2", {}, 0.5), ("gemma", {"head_dim": 64, "tie_word_embeddings": True}, 0.0),
    ("olmo2", {}, 0.0), ("gpt_neox", {"num_key_value_heads": None}, 0.5),
    ("granite", {"embedding_multiplier": 4.0, "attention_multiplier": 0.1,
                 "residual_multiplier": 0.5, "logits_scaling": 2.0}, 0.0),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, 0.0)])
def test_families_through_the_graph_match_transformers_generate(family, config, bias,
                                                                tmp_path_factory):
    cfg = {k: v for k, v in {"model_type": family, **D64, **config}.items() if v is not None}
    path = make_checkpoint(tmp_path_factory, f"g-{family}", 3, cfg, init_std=0.1,
                           bias_std=bias)
    r = make_runner(str(path), num_blocks=32)
    assert r.graph is not None
    stock = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    for p in prompts(VOCAB, (2, 50), seed=1):
        seqs = [list(p)]
        tables = prefilled(r, seqs, 1)
        out = []
        for i in range(10):
            (tok,) = r.execute(make_batch([Part(seqs[0], len(seqs[0]) - 1, 1, tables[0],
                                                gen_index=i)], 16))
            seqs[0].append(tok)
            out.append(tok)
        assert out == stock_greedy(stock, p, 10), (family, len(p))


def test_a_model_deciding_on_tensor_values_in_python_stays_eager(tmp_path_factory, capsys):
    """Mixtral's default experts (grouped matmuls) record exactly; its eager experts loop
    over the experts the tokens hit, which a recording would freeze."""
    path = make_checkpoint(tmp_path_factory, "g-mixtral", 2, {
        "model_type": "mixtral", **D64, "num_local_experts": 4, "num_experts_per_tok": 2},
        init_std=0.1)
    r = make_runner(str(path), num_blocks=32)
    assert r.graph is not None
    r.model.config._experts_implementation = "eager"
    assert graph.capture(r, r.graph.weights) is None
    err = capsys.readouterr().err
    assert "modeling_mixtral.py" in err and "which a recording would freeze" in err


@pytest.fixture(scope="module")
def invariant_runner(d64_dir):
    r = make_runner(str(d64_dir), num_blocks=160, batch_invariant=True)
    assert r.per_row and r.graph is not None
    return r


@pytest.mark.parametrize("chunk", [1, 3, 4, 9, 64])
def test_batch_invariant_steps_prefill_included_take_the_graph_bit_for_bit(invariant_runner,
                                                                           chunk):
    """In the batch-invariant mode every token is a row of the C kernel, so prefill chunks
    and mixed steps run the same recording."""
    r = invariant_runner
    seqs = prompts(VOCAB, (chunk + 10, 30), seed=chunk)
    tables = prefilled(r, seqs, chunk)   # the chunk below recomputes positions 9..
    mixed = make_batch([Part(seqs[1], 29, 1, tables[1]),
                        Part(seqs[0], 9, chunk, tables[0])], 16)
    s = build_step(mixed, r.kv, r.native, r.windows, r.per_row)
    assert graph.DecodeGraph.takes(s)
    assert torch.equal(r.logits(mixed), eager(r, mixed))


def test_batch_invariant_generation_through_the_graph_matches_transformers(invariant_runner,
                                                                           d64_dir):
    stock = AutoModelForCausalLM.from_pretrained(d64_dir, attn_implementation="sdpa")
    p = prompts(VOCAB, (45,), seed=8)[0]
    seq = list(p)
    (table,) = prefilled(invariant_runner, [seq], 8)
    out = []
    for i in range(10):
        (tok,) = invariant_runner.execute(make_batch([Part(seq, len(seq) - 1, 1, table,
                                                           gen_index=i)], 16))
        seq.append(tok)
        out.append(tok)
    assert out == stock_greedy(stock, p, 10)
