"""A model built around layers swapped in before anything loads (worker/skeleton.py) is the
model from_pretrained gives with the same layers swapped in after: the same modules, every
parameter and buffer (the rotary frequencies no file holds among them) equal and of the same
dtype, tied weights one tensor, the same generation config and the same logits. On the
registry model's blocks (the worker's default) and on small checkpoints with biases, an
untied head and a tied one."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from worker import skeleton
from worker.linear.quant import Q8_0
from worker.linear.quant_module import QuantLinear, put
from worker.linear.quantize import quantize

from tests.checkpoints import make_checkpoint

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320}
SWAPPED = ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
           "model.layers.1.mlp.down_proj")


def tensors(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, persistent or not, by each of its names."""
    return {**dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False))}


def assert_same_model(built, loaded, ids: torch.Tensor) -> None:
    assert [(n, type(m)) for n, m in built.named_modules()] == \
           [(n, type(m)) for n, m in loaded.named_modules()]
    a, b = tensors(built), tensors(loaded)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert not built.training
    assert built.generation_config.to_dict() == loaded.generation_config.to_dict()
    with torch.inference_mode():
        assert torch.equal(built(ids).logits, loaded(ids).logits)


def gguf_built(path, tensors=None):
    """The model of a GGUF file as make_runner builds it by default: around its blocks, the
    float tensors read from the file (`tensors`: its map) by their GGUF names; and the swap
    that put them in."""
    from worker.gguf_quant import load_quantized
    from worker.gguf_tensors import GgufTensors
    from worker.load import resolve_checkpoint
    (directory, facts), tensors = resolve_checkpoint(str(path)), tensors or GgufTensors(path)
    arch = facts["architecture"]
    swap = lambda m: load_quantized(m, tensors, arch)   # noqa: E731
    read = lambda m, wanted: tensors.read_parameters(m, wanted, arch)   # noqa: E731
    return skeleton.build(directory, AutoConfig.from_pretrained(directory), "sdpa", swap,
                          read), swap


@pytest.mark.slow  # transformers dequantizes the whole file: ~11 s on 2 cores
def test_the_registry_model_on_its_blocks_is_from_pretrained_then_swapped():
    """What make_runner builds for the default against transformers' own load of the GGUF
    file (every tensor dequantized), swapped the same way."""
    from tests.gguf_files import registry_model, smollm2
    (built, layers), swap = gguf_built(smollm2())
    loaded = registry_model()
    assert swap(loaded) == layers and len(layers) == 7 * 30 + 2
    assert built.lm_head.blocks is built.model.embed_tokens.blocks
    assert_same_model(built, loaded, torch.tensor([[1, 9690, 198, 2683, 314, 260, 3575]]))


def swapper(reference, names):
    """Puts a Q8_0 QuantLinear of the reference's weight at each name, with the model's own
    bias (still empty on the skeleton: loaded after)."""
    def swap(model):
        for name in names:
            bias = model.get_submodule(name).bias
            put(model, name, QuantLinear(quantize(reference.get_submodule(name).weight.data,
                                                  Q8_0), bias))
        return list(names)
    return swap


@pytest.mark.parametrize("family,config,bias", [
    ("qwen2", {}, 0.5),                              # biases on q, k, v; an untied head
    ("llama", {"tie_word_embeddings": True}, 0.0),   # a float head that is the embedding
])
def test_a_checkpoint_with_swapped_layers_is_from_pretrained_then_swapped(
        tmp_path_factory, family, config, bias):
    path = make_checkpoint(tmp_path_factory, family, 3, {"model_type": family, **SMALL,
                                                         **config}, bias_std=bias)
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    swap = swapper(reference, SWAPPED)
    built, names = skeleton.build(path, AutoConfig.from_pretrained(path), "sdpa", swap)
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    swap(loaded)
    assert names == list(SWAPPED)
    if bias:
        q = built.get_submodule(SWAPPED[0])
        assert q.bias is not None and q.bias.abs().sum() > 0   # read after the swap
    tied = built.lm_head.weight is built.model.embed_tokens.weight
    assert tied == bool(config.get("tie_word_embeddings"))
    assert_same_model(built, loaded, torch.tensor([[5, 9, 300, 2, 77, 18]]))


def test_a_tensor_no_file_holds_is_refused(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory, "holed", 3, {"model_type": "llama", **SMALL})
    weights = load_file(path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="no tensor for model.norm.weight"):
        skeleton.build(path, AutoConfig.from_pretrained(path), "sdpa", lambda m: None)
