"""QuantLinear in a model: the layer against F.linear on its own dequantized weight, and the
trained model with every linear layer quantized against transformers' `generate` on the
same dequantized weights (greedy, token for token, a parting allowed only at a top-2
margin under 1e-3, reported)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.linear.quant import TYPES, Q8_0, QuantWeight
from worker.linear.quant_module import QuantLinear, quantize_linears
from worker.linear.quantize import quantize

MARGIN = 1e-3

# the types ggml's reference quantizers write (worker/linear/quantize.py); the K-quants and
# Q5_0/Q5_1 come only from files (tests/worker/test_kquant_kernels.py covers their layers)
QUANTIZABLE = ("Q4_0", "Q4_1", "Q8_0")


@pytest.mark.parametrize("name", QUANTIZABLE)
@pytest.mark.parametrize("rows", [1, 3, 33])
def test_the_layer_is_f_linear_on_its_weight(name, rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(40, 96, generator=g)
    b = torch.randn(40, generator=g)
    layer = QuantLinear(quantize(w, TYPES[name]), b)
    x = torch.randn(2, rows, 96, generator=g)
    want = F.linear(x.double(), layer.dense().double(), b.double())
    got = layer(x)
    assert got.shape == (2, rows, 40)
    # float32 accumulation over 96 products and the bias
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4), (got.double() - want).abs().max()


def test_a_wrong_bias_is_refused():
    with pytest.raises(ValueError, match="bias"):
        QuantLinear(quantize(torch.randn(8, 32), Q8_0), torch.zeros(9))


def test_every_whole_block_linear_is_replaced_but_the_head():
    model = nn.Sequential()
    model.add_module("a", nn.Linear(64, 16))
    model.add_module("odd", nn.Linear(20, 16))      # not whole blocks: stays float
    model.add_module("lm_head", nn.Linear(32, 10))
    x = torch.randn(3, 64)
    before = model.a(x)
    assert quantize_linears(model, Q8_0) == ["a"]
    assert isinstance(model.a, QuantLinear) and isinstance(model.a.qweight, QuantWeight)
    assert type(model.odd) is nn.Linear and type(model.lm_head) is nn.Linear
    assert torch.allclose(model.a(x), before, atol=0.05)   # Q8_0 is close to the float layer


# ------------------------------------------------------------------ the trained model

@pytest.fixture(scope="module")
def trained():
    from transformers import AutoTokenizer

    from tests.gguf_files import smollm2, transformers_model
    from tests.worker.test_trained import QUESTIONS
    path = smollm2()
    model = transformers_model(path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True, return_tensors="pt")
               for q in QUESTIONS]
    return model, [p if isinstance(p, torch.Tensor) else p["input_ids"] for p in prompts]


def pair(model: nn.Module, qtype) -> tuple[nn.Module, nn.Module]:
    """(the model on quantized layers, the model on their dequantized weights)."""
    quant = copy.deepcopy(model)
    names = quantize_linears(quant, qtype)
    assert len(names) == 7 * quant.config.num_hidden_layers
    dense = copy.deepcopy(model)
    for name in names:
        dense.get_submodule(name).weight.data = quant.get_submodule(name).dense()
    return quant, dense


def greedy(model: nn.Module, prompts: list[torch.Tensor], n: int = 32) -> list[list[int]]:
    """Each prompt's first n greedy tokens, the prompts in one left-padded batch (16 rows a
    step instead of 16 steps: the same tokens up to float32 rounding, both models alike)."""
    width = max(p.shape[1] for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=prompts[0].dtype)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - p.shape[1]:], mask[row, width - p.shape[1]:] = p[0], 1
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0)
    return out[:, width:].tolist()


def margin(model: nn.Module, ids: torch.Tensor, prefix: list[int]) -> float:
    with torch.inference_mode():
        logits = model(torch.cat([ids[0], torch.tensor(prefix, dtype=ids.dtype)])[None]).logits
    top = logits[0, -1].double().topk(2).values
    return float(top[0] - top[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", QUANTIZABLE)
def test_the_trained_model_on_quantized_layers_is_transformers_on_their_weights(trained, name):
    model, prompts = trained
    quant, dense = pair(model, TYPES[name])
    partings = []
    for i, (ids, got, want) in enumerate(zip(prompts, greedy(quant, prompts),
                                             greedy(dense, prompts))):
        if got != want:
            at = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
            partings.append((i, at, margin(dense, ids, want[:at])))
    print(f"{name}: {len(prompts) - len(partings)}/{len(prompts)} equal; partings "
          f"(prompt, position, top-2 margin): {partings}")
    assert all(m < MARGIN for _, _, m in partings), partings
    assert len(partings) <= 1, partings
