"""Which kernel multiplies x by a linear layer's weight: the one place that decides.

- `linear`: a dense weight through F.linear (MKL); a weight in panels through the C panel
  kernel (panels.py); a weight in oneDNN's blocked layout (packed.py) through oneDNN, its
  rows padded to MIN_ROWS.
- `row_linear`: the batch-invariant mode's (worker/invariant.py): the same kernels, with a
  call's rows padded to a multiple of ROW_ALIGN, or run in fixed tiles (rows.py's plan); the
  panel kernel needs neither.
While worker/graph.py records the forward, each path is recorded as one op (tl::...).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from worker.linear import ROW_ALIGN, panels

MIN_ROWS = 4     # fewer rows run oneDNN's slower 1-row path: pad (a row's result is the same)


def is_packed(weight: torch.Tensor) -> bool:
    return weight.layout == torch._mkldnn or panels.is_panels(weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for a dense or a packed weight."""
    if panels.is_panels(weight):
        return panels.linear(x, weight, bias)
    if not is_packed(weight):
        return F.linear(x, weight, bias)
    if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
        return torch.ops.tl.packed_linear(x, weight, bias)
    return packed_linear(x, weight, bias)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.numel() // k if k else 0
    if rows == 0:   # oneDNN takes no empty matmul
        return x.new_zeros(*lead, weight.shape[0])
    if rows >= MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    flat = torch.cat([x.reshape(rows, k), x.new_zeros(MIN_ROWS - rows, k)])
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out[:rows].view(*lead, -1)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               tile: int | None = None) -> torch.Tensor:
    """A linear (dense or packed weight, packed.py) whose rows do not depend on the
    call's row count: a multiple of ROW_ALIGN rows per call, or exactly `tile` rows. The
    panel kernel's rows are so in any call (panels.py): no padding there."""
    if panels.is_panels(weight):
        return panels.linear(x, weight, bias)
    if torch.jit.is_tracing():   # recorded as one op, its padding inside: worker/graph.py
        return torch.ops.tl.row_linear(x, weight, bias, tile or 0)
    return padded_linear(x, weight, bias, tile or 0)


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  tile: int) -> torch.Tensor:
    """row_linear's work; `tile` 0: none (the op's schema has no optional int)."""
    tile = tile or None
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    rows = flat.shape[0]
    size = tile or ROW_ALIGN
    if rows == 0 or (tile is None and rows % ROW_ALIGN == 0):
        return linear(x, weight, bias)
    padded = -(-rows // size) * size
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, k)])
    if tile is None:
        out = linear(flat, weight, bias)
    else:
        out = torch.cat([linear(flat[i:i + tile], weight, bias)
                         for i in range(0, padded, tile)])
    return out[:rows].view(*lead, -1)
