"""QuantLinear: an nn.Linear whose weight stays in GGUF blocks (worker/linear/quant.py), and
`quantize_linears`, which puts one in place of each linear layer of a model that a type can
hold (what `--quantize` will do at load; docs/design/cpu-paths.md, "Quantized weights").

Not wired into serving yet: the worker's load path does not call it.
"""
from __future__ import annotations

import torch
from torch import nn

from worker.linear.quant import BLOCK, QuantType, QuantWeight, dequantize, matmul
from worker.linear.quantize import quantize


class QuantLinear(nn.Module):
    """y = x W^T + b with W in quantized blocks; float32 in and out."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"a bias of {list(bias.shape)} for {self.out_features} outputs")
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(),
                                                           requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.qweight, self.bias)

    def dense(self) -> torch.Tensor:
        """The float32 weight it multiplies by (for references and tests)."""
        return dequantize(self.qweight)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={self.qweight.qtype.name}, bias={self.bias is not None}")


def quantizable(mod: nn.Module) -> bool:
    """A float linear layer whose input size is whole blocks."""
    return (type(mod) is nn.Linear and mod.in_features % BLOCK == 0
            and mod.weight.dtype.is_floating_point)


def quantize_linears(model: nn.Module, qtype: QuantType,
                     skip: tuple[str, ...] = ("lm_head",)) -> list[str]:
    """Replace every quantizable nn.Linear of `model` (but the names ending in `skip`: the
    output head shares the embedding's weight in tied models) by a QuantLinear of `qtype`.
    The names replaced, in order."""
    done = []
    for name, mod in list(model.named_modules()):
        if not quantizable(mod) or name.endswith(skip):
            continue
        put(model, name, QuantLinear(quantize(mod.weight.data, qtype), mod.bias))
        done.append(name)
    return done


def put(model: nn.Module, name: str, layer: nn.Module) -> None:
    """Set the submodule `name` ("model.layers.0.mlp.up_proj") of `model` to `layer`."""
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, layer)
