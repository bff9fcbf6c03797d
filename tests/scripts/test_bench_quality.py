"""`scripts/bench quality`: its windowing, perplexity and agreement arithmetic always; the
engine against transformers on a slice of the text (slow, needs the smollm2 model).
llama.cpp is never run here (a benchmark dependency, built on first use)."""
from __future__ import annotations

import json
import math
import struct

import pytest

from scripts.benchmarks import _quality_llamacpp as lc
from scripts.benchmarks import _quality_ppl as qp
from scripts.benchmarks import quality


def test_windows_are_whole_consecutive_and_drop_the_tail():
    toks = list(range(10))
    assert qp.windows(toks, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert qp.windows(toks, 5) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert qp.windows(toks, 11) == []
    with pytest.raises(ValueError):
        qp.windows(toks, 3)


def test_scored_positions_are_llama_perplexity_second_half():
    # perplexity.cpp: first = n_ctx/2; logits at first..n_ctx-2 score tokens first+1..n_ctx-1
    assert qp.scored_positions(512) == range(257, 512)
    assert len(qp.scored_positions(512)) == 512 - 512 // 2 - 1 == 255
    assert qp.scored_positions(7) == range(4, 7)


def test_scored_logprobs_take_the_second_half_and_refuse_gaps():
    lps = [None, -9.0, -8.0, -7.0, -1.0, -2.0, -3.0, -4.0]
    assert qp.scored_logprobs(lps, 8) == [-2.0, -3.0, -4.0]
    with pytest.raises(ValueError):
        qp.scored_logprobs(lps[:-1], 8)
    with pytest.raises(ValueError):
        qp.scored_logprobs(lps[:5] + [None] + lps[6:], 8)
    with pytest.raises(ValueError):
        qp.scored_logprobs(lps[:5] + [float("-inf")] + lps[6:], 8)


def test_perplexity_is_exp_of_the_mean_nll_over_every_window():
    uniform = [[-math.log(50)] * 3, [-math.log(50)] * 5]
    p = qp.perplexity(uniform)
    assert p.tokens == 8 and p.ppl == pytest.approx(50.0, rel=1e-12)
    p = qp.perplexity([[-1.0], [-2.0, -3.0]])
    assert p.nll == pytest.approx(2.0) and p.ppl == pytest.approx(math.e ** 2)
    with pytest.raises(ValueError):
        qp.perplexity([[], []])
    assert qp.relative_diff(10.1, 10.0) == pytest.approx(0.01)
    assert qp.relative_diff(None, 10.0) is None


def test_agreement_counts_identical_requests_and_where_the_others_part():
    eog = frozenset({0, 2})
    top = lambda a, b: {7: a, 8: b}  # noqa: E731
    engine = [([5, 6, 2], [top(-0.1, -3.0)] * 3),       # same, both end (llama.cpp on 0)
              ([5, 6, 7, 9], [top(-0.5, -0.6)] * 4),    # parts at 2
              ([5, 2], [top(-0.2, -2.0), top(-1.0, -1.5)]),   # ends first: parts at 1
              ([1] * 40, [top(-0.1, -0.2)] * 40)]      # same first 32, then differ
    peer = [[5, 6, 0], [5, 6, 8, 9], [5, 4, 4], [1] * 32 + [3]]
    ag = qp.agreement(engine, peer, eog, 32)
    assert ag["requests"] == 4 and ag["identical"] == 2
    assert ag["parted"] == [
        {"request": 1, "position": 2, "engine": 7, "llamacpp": 8, "margin": pytest.approx(0.1)},
        {"request": 2, "position": 1, "engine": 2, "llamacpp": 4, "margin": pytest.approx(0.5)}]
    assert ag["margin_median"] == ag["margin_max"] == pytest.approx(0.5)
    assert qp.parting([1, qp.END], [1]) == 1 and qp.parting([1], [1]) is None


def test_llama_perplexity_outputs_are_read(tmp_path):
    f = tmp_path / "base"
    f.write_bytes(b"_logits_" + struct.pack("<iii", 4, 49152, 2)
                  + struct.pack("<8i", *range(8)) + b"\0" * 64)
    assert lc.read_base_tokens(f) == (4, list(range(8)))
    f.write_bytes(b"_nolog__" + b"\0" * 12)
    with pytest.raises(ValueError):
        lc.read_base_tokens(f)
    out = "[1]12.3456,[2]13.0000,\nFinal estimate: PPL = 12.8765 +/- 0.54321\n"
    assert lc.parse_final(out) == 12.8765
    with pytest.raises(RuntimeError):
        lc.parse_final("failed to load model")


def test_the_committed_data_is_what_the_benchmark_promises():
    text = quality.text_of(quality.TEXT)
    assert not text.endswith("\n") and len(text.split()) > 2000
    prompts = json.loads(quality.PROMPTS.read_text())
    assert len(prompts) == len(set(prompts)) == 64


def _smollm2_or_skip():
    from worker.load import model_problem
    if (why := model_problem("smollm2")) is not None:
        pytest.skip(f"smollm2 unavailable: {why}")
    return quality.gguf_model("smollm2")


@pytest.mark.slow
def test_engine_and_transformers_agree_on_a_slice(tmp_path):
    """Two windows of 128 tokens of the text: the engine's prompt logprobs over HTTP and
    stock transformers on the same float32 weights give perplexities within 0.1%."""
    from scripts.benchmarks import _quality_hf as hf
    _, ckpt = _smollm2_or_skip()
    wins = qp.windows(quality.text_tokens(ckpt)[:256], 128)
    engine, _ = quality.run_engine("smollm2", tmp_path, wins, 128, [], [])
    from worker.load import float_checkpoint, resolve_checkpoint
    ref = hf.score(float_checkpoint(*resolve_checkpoint("smollm2")), wins, 128)
    e, t = qp.perplexity(engine), qp.perplexity(ref)
    assert e.tokens == t.tokens == 2 * 63
    assert 1.0 < t.ppl < 1000.0        # a trained model on English prose
    assert qp.relative_diff(e.ppl, t.ppl) < 1e-3
