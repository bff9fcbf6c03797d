"""The batch-invariant mode's linear layers (worker/invariant.py): per weight shape, whether
padding a call to a multiple of ROW_ALIGN rows makes each row's result independent of the
call's row count, or fixed tiles of TILE rows do; checked once at load."""
from __future__ import annotations

import torch
from torch import nn

from worker.linear import ROW_ALIGN, panels
from worker.linear.dispatch import row_linear

TILE = 64       # the fallback: every call exactly this many rows
# The row counts the load-time check tries: every count where MKL's choice was seen to change
# (below 12), and a few above. Wider layers (the LM head, > LM_HEAD_OUT outputs) see at most
# a step's sample rows, and their calls cost the most: the check stops at 64 rows there.
CHECK_ROWS = (4, 5, 6, 7, 9, 10, 11, 13, 33, 64, 300)
LM_HEAD_OUT = 8192


def make_invariant(model) -> dict[str, int]:
    """Replace every nn.Linear's forward (dense weights; worker/linear/packed.py takes `matmul_plan`
    instead); returns {layer name: TILE} for the layers that need fixed tiles (empty where
    padding to ROW_ALIGN suffices, as on the CPU measured)."""
    plans: dict[tuple, int | None] = {}
    tiled = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        shape = (mod.in_features, mod.out_features, mod.bias is not None)
        if shape not in plans:
            plans[shape] = _plan(mod.weight, mod.bias)
        tile = plans[shape]
        if tile:
            tiled[name] = tile
        mod.forward = _forward(mod, tile)
    return tiled


def matmul_plan(weight: torch.Tensor, bias: torch.Tensor | None):
    """The row-invariant matmul for this (packed or dense) weight: worker/linear/packed.py's plan."""
    tile = _plan(weight, bias)
    return lambda x, w, b: row_linear(x, w, b, tile)


def _forward(mod: nn.Linear, tile: int | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return row_linear(x, mod.weight, mod.bias, tile)
    return forward


def _plan(weight: torch.Tensor, bias: torch.Tensor | None) -> int | None:
    """None when padding to ROW_ALIGN makes this layer's rows invariant, else TILE when
    fixed tiles do; ValueError when neither does."""
    for tile in (None, TILE):
        if _invariant(weight, bias, tile):
            return tile
    out, k = _dims(weight)
    raise ValueError(f"--batch-invariant: a linear layer {k}x{out}"
                     " gives rows that depend on the row count even in fixed tiles here")


@torch.inference_mode()
def _invariant(weight: torch.Tensor, bias: torch.Tensor | None, tile: int | None) -> bool:
    """Whether the first and last ROW_ALIGN rows of calls of many sizes equal the same rows
    computed in a call of their own (fewer rows: the first of them)."""
    out_features, in_features = _dims(weight)
    counts = [m for m in CHECK_ROWS if out_features <= LM_HEAD_OUT or m <= 64]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(counts[-1], in_features, generator=g).to(weight.device, weight.dtype)
    head = row_linear(x[:ROW_ALIGN], weight, bias, tile)
    for m in counts:
        out = row_linear(x[:m], weight, bias, tile)
        tail = row_linear(x[m - ROW_ALIGN:m], weight, bias, tile)
        if not (torch.equal(out[:ROW_ALIGN], head) and torch.equal(out[-ROW_ALIGN:], tail)):
            return False
    for m in range(1, ROW_ALIGN):
        if not torch.equal(row_linear(x[:m], weight, bias, tile), head[:m]):
            return False
    return True


def _dims(weight: torch.Tensor) -> tuple[int, int]:
    """(out, in) features of a dense, oneDNN-packed or panel weight."""
    return panels.features(weight) if panels.is_panels(weight) else tuple(weight.shape)
