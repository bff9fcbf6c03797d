"""The registry model's GGUF tensors as QuantLinear layers on their own blocks: every one is
transformers' dequantized weight (its GGUF reader's) bit for bit once dequantized (names and
the Q/K row order right), and the model on them scores a chat prompt as the float model does
(slow: ~20 s, most of it the two models' load)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.gguf_names import module_name, parameter_name, unpermute
from worker.gguf_quant import load_quantized
from worker.linear.quant_module import QuantEmbedding, QuantLinear


def converter_permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: HF rows -> GGUF rows (its rotary layout)."""
    out = rows.shape[0]
    return (rows.reshape(n_head, 2, out // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


@pytest.mark.parametrize("n_head,out", [(1, 8), (3, 24), (9, 576)])
def test_unpermute_undoes_the_converter(n_head, out):
    rows = np.arange(out * 5, dtype=np.uint8).reshape(out, 5)
    assert np.array_equal(unpermute(converter_permute(rows, n_head), n_head), rows)
    if n_head > 1:
        assert not np.array_equal(converter_permute(rows, n_head), rows)


def test_module_names():
    assert module_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert module_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj"
    for other in ("token_embd.weight", "blk.0.attn_norm.weight", "output.weight",
                  "blk.0.attn_q.bias"):
        assert module_name(other) is None
    assert parameter_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert parameter_name("blk.2.ffn_norm.weight") == \
        "model.layers.2.post_attention_layernorm.weight"
    assert parameter_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert parameter_name("blk.1.attn_v.bias") == "model.layers.1.self_attn.v_proj.bias"
    assert parameter_name("output_norm.weight") == "model.norm.weight"
    assert parameter_name("rope_freqs.weight") is None


def test_an_architecture_it_does_not_read_is_refused():
    with pytest.raises(ValueError, match="gpt2"):
        load_quantized(torch.nn.Module(), None, "gpt2")


@pytest.fixture(scope="module")
def models():
    from tests.gguf_files import registry_model, smollm2
    from worker.gguf_tensors import GgufTensors
    dense, quant = registry_model(), registry_model()
    return dense, quant, load_quantized(quant, GgufTensors(smollm2()), "llama")


@pytest.mark.slow
def test_every_linear_layer_is_its_blocks_and_equals_the_checkpoint(models):
    dense, quant, done = models
    assert len(done) == 7 * dense.config.num_hidden_layers + 2
    # the registry file's types: Q4_1 layers, a Q8_0 embedding that the output head shares
    assert {n: t for n, t in done.items() if t != "Q4_1"} == {"model.embed_tokens": "Q8_0",
                                                              "lm_head": "Q8_0"}
    for name in done:
        layer = quant.get_submodule(name)
        if name == "model.embed_tokens":
            assert isinstance(layer, QuantEmbedding)
            ids = torch.arange(0, dense.config.vocab_size, 97)
            assert torch.equal(layer(ids), dense.get_input_embeddings()(ids))
            continue
        assert isinstance(layer, QuantLinear), name
        assert torch.equal(layer.dense(), dense.get_submodule(name).weight), name
    assert quant.lm_head.blocks is quant.model.embed_tokens.blocks   # one copy, as tied


@pytest.mark.slow
def test_the_model_on_its_blocks_scores_as_the_float_model(models):
    dense, quant, _ = models
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 260, 3575, 282, 4649, 47, 2, 198]])
    with torch.inference_mode():
        a, b = dense(ids).logits[0], quant(ids).logits[0]
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    # the same weights summed in another order: float32 rounding, not a different model
    assert (a - b).abs().max() < 1e-3 * a.abs().max(), (a - b).abs().max()
