"""Quantized linear layers that read one input, multiplied as one weight (q, k and v; gate
and up), as worker/linear/packed.py does for float weights: a layer's rows are whole blocks,
so the fused weight is the members' blocks one after another. Fewer kernel calls a step
(smol: 121 instead of 211), each with its fixed cost; every output is summed as before, so
the bits do not change (the kernel's order ignores the column tile a row falls in).

Which layers those are is traced, not assumed (packed.siblings with QuantLinear). A member
called with another tensor than the one its group's first member was recomputes the product
for it, so a code path the trace did not see still gets exact answers.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from worker.linear import packed
from worker.linear.quant import QuantWeight
from worker.linear.quant_module import QuantLinear


def alike(a: QuantLinear, b: QuantLinear) -> bool:
    return (a.in_features == b.in_features and a.qweight.qtype is b.qweight.qtype
            and (a.bias is None) == (b.bias is None))


class FusedQuant(packed.Columns):
    """The members' blocks as one QuantLinear."""

    def __init__(self, mods: list[QuantLinear]):
        super().__init__([m.out_features for m in mods])
        first = mods[0]
        blocks = torch.cat([m.blocks for m in mods])
        bias = None if first.bias is None else torch.cat([m.bias.detach() for m in mods])
        self.layer = QuantLinear(QuantWeight(blocks, first.qweight.qtype,
                                             (blocks.shape[0], first.in_features)), bias)
        self.layer.bf16_rows, self.layer.int8 = first.bf16_rows, first.int8

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def fuse(model: nn.Module, forward: Callable[[], object]) -> list[FusedQuant]:
    """Fuse the model's sibling QuantLinear layers in place; the fused weights made."""
    made = []
    for group in packed.siblings(model, forward, QuantLinear, alike):
        if len(group) < 2:
            continue
        fused = FusedQuant(group)
        for i, mod in enumerate(group):
            _hand_over(mod, lambda x, i=i, f=fused: f.take(i, x))
        made.append(fused)
    return made


def _hand_over(mod: QuantLinear, forward) -> None:
    """The member's own blocks are dropped (the fused copy holds them)."""
    mod.blocks = torch.empty(0, dtype=torch.uint8)
    mod.qweight = None
    mod.forward = forward
