"""The trained model as the K-quant files people download (`Q4_K_M`, `Q5_K_M`, `Q6_K`), served
on their own blocks: every tensor type of the mix (Q4_K, Q5_K, Q6_K and the Q5_0, Q5_1, Q8_0
fallbacks) through its native kernel, and greedy tokens equal to transformers' `generate` on
the same weights as gguf-py dequantizes them. The files are made here (tests/kquant_files.py);
where llama.cpp's `llama-quantize` has been built in the cache (a benchmark dependency), its
own files of the same mixes are checked too."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.gguf_files import registry_tokenizer, transformers_model
from tests.kquant_files import SCHEMES, mixed_file
from tests.worker.test_trained import MARGIN, NEW_TOKENS, QUESTIONS, _ids, _margin
from tests.worker.test_worker_engine import GREEDY, run_engine, stock_greedy_batch
from worker.load import make_runner
from worker.presets import cache_root
from worker.registry_models import gguf_path


def made_here(scheme: str) -> Path:
    out = cache_root().parent / "test-gguf" / f"smollm2.{scheme}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    return mixed_file(gguf_path("smollm2"), out, scheme)


def by_llama_quantize(scheme: str) -> Path:
    """llama-quantize's file of `scheme` from the registry file's F32 copy, where the tool is
    built (skipped elsewhere: CI builds no llama.cpp)."""
    from scripts.benchmarks import _llamacpp_get as get
    tool = get.found("llama-quantize")
    if tool is None:
        pytest.skip("llama-quantize is not built in the cache")
    from scripts.benchmarks._llamacpp_quantize import requantized
    out = get.home() / "gguf" / f"smollm2.{scheme}.gguf"
    if not out.is_file():
        get._run([tool, requantized(gguf_path("smollm2"), "F32"), out, scheme],
                 get.home() / "quantize.log", "llama-quantize")
    return out


# each file costs ~12 s on 2 cores (made, then read by transformers): the slow suite
# serves every one (.ci/run); the default suite checks each block type's kernel against
# gguf-py's dequantization and the batch invariance of its sums (test_kquant_kernels.py)
SOURCES = [pytest.param((make, s), marks=pytest.mark.slow)
           for make in (made_here, by_llama_quantize) for s in SCHEMES]


@pytest.fixture(scope="module", params=SOURCES, ids=lambda p: f"{p[0].__name__}-{p[1]}")
def served(request):
    make, scheme = request.param
    path = make(scheme)
    runner = make_runner(str(path), num_blocks=256, batch_invariant=None)
    stock = transformers_model(path)
    tok = registry_tokenizer()   # each file's tokenizer fields are the registry file's, copied
    return scheme, runner, stock, tok


def test_every_tensor_of_the_mix_is_served_on_its_own_blocks(served):
    scheme, runner, _, _ = served
    layers = runner.info.quantization["layers"]
    assert runner.info.quantization["mode"] == "gguf"
    assert not [t for t in layers.values() if " from " in t], "re-quantized layers"
    assert len(layers) == 7 * 30 + 2   # every linear layer, the embedding and the tied head
    want = {"Q4_K_M": {"Q5_0", "Q8_0", "Q4_K", "Q6_K"},
            "Q5_K_M": {"Q5_1", "Q8_0", "Q5_K", "Q6_K"}, "Q6_K": {"Q8_0", "Q6_K"}}[scheme]
    assert set(layers.values()) == want


@pytest.mark.slow  # 16 chat prompts through transformers generate, for each file
def test_greedy_tokens_of_sixteen_chats_equal_transformers(served):
    _, runner, stock, tok = served
    _compare(runner, stock, [_ids(tok, q) for q in QUESTIONS])


def _compare(runner, stock, prompts: list[list[int]]) -> None:
    """Token for token; a parting only at a top-2 margin under MARGIN, at most once."""
    ours, _ = run_engine(runner, [(p, NEW_TOKENS, GREEDY) for p in prompts], max_chunk=64)
    partings = []
    for p, got, want in zip(prompts, ours, stock_greedy_batch(stock, prompts, NEW_TOKENS)):
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            partings.append((at, _margin(stock, p + want[:at])))
    assert all(m < MARGIN for _, m in partings) and len(partings) <= 1, (
        f"position and top-2 margin where the engine parts from transformers: {partings}")
