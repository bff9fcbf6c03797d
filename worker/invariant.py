"""The batch-invariant mode (scripts/serve --batch-invariant): a row's logits do not depend
on the other rows of the step (docs/DESIGN.md, "Batch-invariant mode").

Two things break it on the CPU, both fixed here through transformers' hooks, not model code:
- Linear layers: MKL picks its sgemm kernel by shape, so a row's result depends on how
  many rows share the call. Measured here: calls of 1, of 2-3 rows, and the rows past the
  last multiple of 4 in calls of 5-11 rows each round differently; every other row equals
  its result in a call of 4 rows. Each nn.Linear's forward is replaced by one that pads a
  call to a multiple of ROW_ALIGN rows; where a load-time check finds a shape whose rows
  still vary, that layer runs in fixed tiles of TILE rows (every call the same shape); where
  even that varies the mode is refused.
- Attention: SDPA (prefill) and the C kernel (decode) reduce in different orders, and a
  chunked prefill splits the reduction. In this mode every query token, prefill tokens
  included, is a row of the C kernel (worker/step.py `per_row`): its keys in block order,
  one thread per (token, KV head), whatever the chunk or the batch.
RMSNorm, softmax, log_softmax, sort and cumsum over the last dim are already per-row
invariant in torch's CPU kernels (checked by tests/worker/test_invariant.py end to end).
"""
from __future__ import annotations

import torch
from torch import nn

from worker import archs, native, panels
from worker.packed import linear

ROW_ALIGN = 4   # calls of a multiple of 4 rows agree row by row, whatever the count
TILE = 64       # the fallback: every call exactly this many rows
# The row counts the load-time check tries: every count where MKL's choice was seen to change
# (below 12), and a few above. Wider layers (the LM head, > LM_HEAD_OUT outputs) see at most
# a step's sample rows, and their calls cost the most: the check stops at 64 rows there.
CHECK_ROWS = (4, 5, 6, 7, 9, 10, 11, 13, 33, 64, 300)
LM_HEAD_OUT = 8192


def check_supported(model, kv: torch.Tensor, rep: int, tp: int) -> None:
    """ValueError saying why the mode cannot run this model here."""
    cfg = model.config
    if tp != 1:
        raise ValueError("--batch-invariant runs with one worker process (--tp 1): the "
                         "all-reduces of tensor parallelism sum in a schedule of their own")
    if not archs.plain_attention(cfg):
        raise ValueError("--batch-invariant needs the C attention kernel, which has no "
                         "sliding window or softcap; this model uses one")
    if not native.usable(kv, rep, any_dim=True):
        raise ValueError("--batch-invariant needs the C attention kernel (CPU, float32, a "
                         f"head dim that is a multiple of 16 up to 128, at most 16 query "
                         f"heads per KV head); here: {kv.device.type}, {kv.dtype}, head dim "
                         f"{kv.shape[-1]}, {rep} per KV head, kernel "
                         f"{'built' if native.kernel() else 'unavailable'}")
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            continue
        weights = [n for n, p in mod.named_parameters(recurse=False) if p.dim() >= 2]
        if weights:
            raise ValueError(f"--batch-invariant covers nn.Linear layers only; {name} "
                             f"({type(mod).__name__}) multiplies by its own {weights[0]}")


def supported(model, kv: torch.Tensor, tp: int) -> bool:
    """Whether the mode can run this model here (the default, where it can: its cost was
    under 5% on the mixed workload, docs/DESIGN.md "Batch-invariant mode")."""
    cfg = model.config
    rep = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None)
                                      or cfg.num_attention_heads)
    try:
        check_supported(model, kv, rep, tp)
    except ValueError:
        return False
    return True


def make_invariant(model) -> dict[str, int]:
    """Replace every nn.Linear's forward (dense weights; worker/packed.py takes `matmul_plan`
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
    """The row-invariant matmul for this (packed or dense) weight: worker/packed.py's plan."""
    tile = _plan(weight, bias)
    return lambda x, w, b: row_linear(x, w, b, tile)


def _forward(mod: nn.Linear, tile: int | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return row_linear(x, mod.weight, mod.bias, tile)
    return forward


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               tile: int | None = None) -> torch.Tensor:
    """A linear (dense or packed weight, worker/packed.py) whose rows do not depend on the
    call's row count: a multiple of ROW_ALIGN rows per call, or exactly `tile` rows. The
    panel kernel's rows are so in any call (worker/panels.py): no padding there."""
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
