"""A GGUF file's tensors used in place (worker/gguf_tensors.py): the blocks the model serves
are the file's map itself, but for the Q/K rows the converter permuted (copies, put back in
transformers' order); the norms are gguf-py's values; float-typed linear tensors (and a
float embedding that is also the head) load as float32 weights; qwen2's biases and qwen3's
q/k norms are read as stored; each model is transformers' own reading of the file; the map's
pages nothing serves from are released."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from worker.gguf_tensors import GgufTensors
from worker.linear.quant_module import QuantEmbedding, QuantLinear

from tests import gguf_files
from tests.worker.test_skeleton import assert_same_model, gguf_built

IDS = torch.tensor([[1, 9690, 198, 2683, 314, 260, 3575, 282, 4649, 47, 2, 198]])


@pytest.fixture(scope="module")
def served():
    (model, _), _ = gguf_built(gguf_files.smollm2())
    return model


def map_range(model) -> tuple[int, int]:
    """Where the model's map of the file lies in memory: the map one of its views holds."""
    blocks = model.model.layers[0].mlp.down_proj.blocks
    tensors = GgufTensors(gguf_files.smollm2())
    down = next(t for t in tensors.index.tensors if t.name == "blk.0.ffn_down.weight")
    base = blocks.data_ptr() - down.offset
    return base, base + tensors.index.size


def test_the_blocks_are_the_file_map_but_the_permuted_rows(served):
    start, end = map_range(served)
    in_map, copied = [], []
    for name, m in served.named_modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            ptr = m.blocks.data_ptr()
            (in_map if start <= ptr and ptr + m.blocks.nbytes <= end else copied).append(name)
    assert sorted(copied) == sorted(f"model.layers.{i}.self_attn.{p}_proj"
                                    for i in range(30) for p in "qk")
    assert len(in_map) == 5 * 30 + 2   # the embedding and the head it is: one view
    assert served.lm_head.blocks.data_ptr() == served.model.embed_tokens.blocks.data_ptr()


def test_the_norms_are_gguf_py_values_read_in_place(served):
    from gguf import GGUFReader
    start, end = map_range(served)
    reader = GGUFReader(gguf_files.smollm2())
    norms = {t.name: t for t in reader.tensors if t.name.endswith("norm.weight")}
    assert len(norms) == 2 * 30 + 1
    for i, layer in enumerate(served.model.layers):
        for gguf_name, ours in (("attn_norm", layer.input_layernorm.weight),
                                ("ffn_norm", layer.post_attention_layernorm.weight)):
            theirs = np.asarray(norms[f"blk.{i}.{gguf_name}.weight"].data)
            assert torch.equal(ours, torch.from_numpy(theirs.copy())), (i, gguf_name)
            assert start <= ours.data_ptr() < end   # F32 in the file: no copy
    assert torch.equal(served.model.norm.weight,
                       torch.from_numpy(np.asarray(norms["output_norm.weight"].data).copy()))


def test_the_pages_nothing_serves_from_are_released():
    """The permuted Q/K blocks (copied) leave the process's memory; what is served stays."""
    tensors = GgufTensors(gguf_files.smollm2())
    (model, _), _ = gguf_built(gguf_files.smollm2(), tensors)
    with torch.inference_mode():
        before = model(IDS).logits
        released = tensors.release_unused(model)
        after = model(IDS).logits
    permuted = sum(t.n_bytes for t in tensors.index.tensors
                   if t.name.endswith(("attn_q.weight", "attn_k.weight")))
    assert permuted * 0.9 < released < permuted + 2 * 1024 * 1024   # and the header's pages
    assert torch.equal(before, after)


FLOAT_TENSORS = {"blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.2.ffn_down.weight",
                 "token_embd.weight"}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_float_typed_linear_tensors_load_as_float_weights(tmp_path, dtype):
    """A permuted Q, a V, a down projection and the embedding (the tied head too) stored as
    float: read as float32 parameters, Q's rows put back; the model is transformers' own
    reading of the file, swapped the same way, tensor for tensor and logit for logit."""
    path = gguf_files.with_float_tensors(tmp_path / "mixed.gguf", FLOAT_TENSORS, dtype)
    (built, layers), swap = gguf_built(path)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj",
                 "model.layers.2.mlp.down_proj", "lm_head"):
        assert type(built.get_submodule(name)) is nn.Linear and name not in layers, name
    assert built.lm_head.weight is built.model.embed_tokens.weight
    assert len(layers) == 7 * 30 - 3
    loaded = gguf_files.transformers_model(path)
    assert swap(loaded) == layers
    assert_same_model(built, loaded, IDS)


@pytest.mark.parametrize("family, head_dim", [("qwen2", 16), ("qwen3", 128)])
def test_qwen_layouts_read_their_biases_and_norms_unpermuted(tmp_path, family, head_dim):
    """qwen2's q/k/v biases and qwen3's q/k norms come from the file as stored (the converter
    permutes neither): the model is transformers' own reading of the file, swapped."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(family, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512, head_dim=head_dim,
                                  tie_word_embeddings=False)
    torch.manual_seed(0)
    source = AutoModelForCausalLM.from_config(config)
    for name, p in source.named_parameters():   # not the init's ones and zeros
        if name.endswith("bias") or "norm" in name:
            p.data.normal_(1.0 if "norm" in name else 0.0, 0.3)
    path = gguf_files.written(tmp_path / f"{family}.gguf", source, family)
    (built, layers), swap = gguf_built(path)
    assert len(layers) == 7 * 2 + 2   # the embedding and the untied head too
    extra = {"qwen2": "self_attn.q_proj.bias", "qwen3": "self_attn.q_norm.weight"}[family]
    assert torch.equal(built.get_submodule("model.layers.1").get_parameter(extra),
                       source.get_submodule("model.layers.1").get_parameter(extra))
    loaded = gguf_files.transformers_model(path)
    assert swap(loaded) == layers
    assert_same_model(built, loaded, torch.tensor([[5, 9, 300, 2, 77, 18]]))
