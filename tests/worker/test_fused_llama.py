"""A Llama model on the C row ops (worker/fused_llama.py) answers as transformers' own code
within float32 rounding, greedy tokens and its KV cache path included; other families and
TL_ROW_OPS=0 keep their code; a runner's graph records the row ops (and the KV write)."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from worker import fused_llama, row_ops

pytestmark = pytest.mark.skipif(row_ops.kernel() is None, reason="no C compiler here")

SMALL = dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3,
             num_attention_heads=6, num_key_value_heads=2, vocab_size=300,
             max_position_embeddings=256)


def _pair(cls, config):
    torch.manual_seed(0)
    stock = cls(config).eval()
    with torch.no_grad():   # norms are initialised to ones: make each its own
        for name, p in stock.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    fused = copy.deepcopy(stock)
    return stock, fused, fused_llama.adapt(fused)


@pytest.fixture(scope="module")
def llama():
    return _pair(LlamaForCausalLM, LlamaConfig(**SMALL, attn_implementation="sdpa"))


def test_every_llama_module_is_adapted(llama):
    # per layer: 2 norms, attention, the layer; and the final norm
    assert llama[2] == 3 * 4 + 1


@torch.inference_mode()
def test_logits_equal_transformers_within_float32_rounding(llama):
    stock, fused, _ = llama
    ids = torch.randint(0, 300, (2, 37), generator=torch.Generator().manual_seed(1))
    want, got = stock(ids).logits, fused(ids).logits
    assert not torch.equal(want, got)   # the norm sums in another order: not the same code
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_greedy_generation_through_the_kv_cache_equals_transformers(llama):
    stock, fused, _ = llama
    ids = torch.tensor([[5, 17, 99, 3, 250]])
    want = stock.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(fused.generate(ids, max_new_tokens=12, do_sample=False), want)


def test_other_families_keep_their_code():
    _, _, changed = _pair(Qwen2ForCausalLM, Qwen2Config(**SMALL))
    assert changed == 0


def test_tl_row_ops_0_or_no_kernel_leaves_the_model_alone(llama, monkeypatch):
    stock = llama[0]
    assert fused_llama.usable(stock, 1)
    assert not fused_llama.usable(stock, 2)
    monkeypatch.setenv("TL_ROW_OPS", "0")
    assert not fused_llama.usable(stock, 1)
    monkeypatch.delenv("TL_ROW_OPS")
    monkeypatch.setattr(row_ops, "kernel", lambda: None)
    assert not fused_llama.usable(stock, 1)


def test_a_runners_decode_graph_records_the_row_ops(tmp_path_factory):
    from tests.checkpoints import make_checkpoint
    from worker import native
    from worker.load import make_runner

    if native.kernel() is None:
        pytest.skip("no C decode kernel: no decode graph")
    path = make_checkpoint(tmp_path_factory, "rows", 3, {
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 300}, init_std=0.1)
    runner = make_runner(str(path), num_blocks=16)
    assert runner.graph is not None   # recorded, and bit for bit the eager forward
    kinds = [n.kind() for n in runner.graph.fn.graph.nodes()]
    assert [kinds.count(f"tl::{op}") for op in ("rms_norm", "add_rms_norm", "rope")] == [3, 2, 2]
    assert "aten::pow" not in kinds and "aten::neg" not in kinds
    assert kinds.count("tl::kv_write") == 2 and "aten::index_copy_" not in kinds
