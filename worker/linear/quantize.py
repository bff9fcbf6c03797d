"""Float weights -> GGUF's Q8_0, Q4_0 and Q4_1 blocks, rounding as ggml's reference
quantizers do (quantize_row_q8_0_ref and its siblings in ggml-quants.c), so a block is the
bytes llama.cpp would write for it. Every step is a float32 operation as ggml's, unfused.
"""
from __future__ import annotations

import torch

from worker.linear.quant import BLOCK, Q4_0, Q4_1, Q8_0, QuantType, QuantWeight


def quantize(weight: torch.Tensor, qtype: QuantType) -> QuantWeight:
    """An [out, in] float weight (in a multiple of 32) in `qtype`'s blocks."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK:
        raise ValueError(f"quantizing takes an [out, in] weight with in a multiple of {BLOCK}, "
                         f"not {list(weight.shape)}")
    quantizer = QUANTIZERS.get(qtype)
    if quantizer is None:   # the K-quants and Q5 types are read from files, not made here
        raise ValueError(f"quantizing makes {', '.join(t.name for t in QUANTIZERS)} blocks,"
                         f" not {qtype.name}")
    out, k = weight.shape
    x = weight.detach().to(torch.float32).reshape(out, k // BLOCK, BLOCK)
    parts = quantizer(x)
    data = torch.cat([p.contiguous().view(torch.uint8) for p in parts], dim=-1)
    return QuantWeight(data.reshape(out, -1).contiguous(), qtype, (out, k))


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """ggml's `id = d ? 1.0f/d : 0.0f`."""
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf (halves away from zero); in float64, where |v| + 0.5 is exact."""
    return torch.sign(v) * torch.floor(v.abs().double() + 0.5).float()


def _q8_0(x: torch.Tensor) -> list[torch.Tensor]:
    d = x.abs().amax(dim=-1, keepdim=True) / 127
    q = _roundf(x * _inverse(d)).to(torch.int8)
    return [d.to(torch.float16), q]


def _q4_0(x: torch.Tensor) -> list[torch.Tensor]:
    first_max = x.abs().argmax(dim=-1, keepdim=True)   # ggml keeps the first of equal |x|
    d = x.gather(-1, first_max) / -8
    q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15)
    return [d.to(torch.float16), _pack(q)]


def _q4_1(x: torch.Tensor) -> list[torch.Tensor]:
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15)
    return [d.to(torch.float16), lo.to(torch.float16), _pack(q)]


def _pack(q: torch.Tensor) -> torch.Tensor:
    """[..., 32] values 0..15 -> [..., 16] bytes: element j low, j + 16 high (ggml's order)."""
    q = q.to(torch.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


# The types this module makes, each with its ggml reference quantizer.
QUANTIZERS = {Q8_0: _q8_0, Q4_0: _q4_0, Q4_1: _q4_1}
