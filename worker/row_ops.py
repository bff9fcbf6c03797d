"""The Llama family's small per-token ops in C (worker/csrc/row_ops.c): RMSNorm (optionally after the
residual add) and the rotary embedding of q and k. Each replaces 9-16 of torch's calls;
worker/fused_llama.py puts them in a model's modules. Every row is summed in one fixed
order, whatever the call's rows.

While worker/graph.py records the forward each is recorded as one op (tl::rms_norm, ...),
whose kernel is the function the eager forward calls. Without the kernel (no C compiler,
TL_NATIVE=0, or TL_ROW_OPS=0) the modules keep transformers' torch code.
"""
from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch

from worker import native

SOURCE = Path(__file__).parent / "csrc" / "row_ops.c"
# products and sums round as torch's separate ops do (no fused multiply-adds)
EXTRA = ("-ffp-contract=off", "-lm")
_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def enabled() -> bool:
    return os.environ.get("TL_ROW_OPS", "1") != "0" and native.enabled()


@cache
def kernel():
    """The loaded library, or None with one line on stderr saying why."""
    return load() if native.enabled() else None


def load(source: Path = SOURCE):
    """The library built from `source` (tests build mutants of it), or None."""
    lib = native.load(source, "native row ops unavailable, using torch", EXTRA)
    if lib is None:
        return None
    lib.tl_rms_norm.argtypes = (_P, _I64, _P, _I64, _P, _F, _I64, _I64, _P, _P, _INT)
    lib.tl_rope.argtypes = (_P, _I64, _I64, _P, _I64, _I64, _P, _P, _I64, _I64, _P, _P,
                            _INT)
    return lib


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(x or a copy, rows, row stride) for x [..., n] read as rows of n with unit stride
    (x itself where it is contiguous: the common case, kept cheap)."""
    if x.dtype != torch.float32 or not x.is_cpu:
        raise TypeError(f"the native row ops take CPU float32, not {x.device} {x.dtype}")
    n = x.shape[-1]
    if x.is_contiguous():
        return x, x.numel() // n if n else 0, n
    flat = x.reshape(-1, n)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return flat, flat.shape[0], flat.stride(0)


def _out(x: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 tensor of x's shape (empty_like is the cheaper call)."""
    return torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape,
                                                                      dtype=torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x * rsqrt(mean(x^2, -1) + eps))."""
    if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
        return torch.ops.tl.rms_norm(x, weight, eps)
    return rms_norm_kernel(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rms_norm(s)) for s = residual + x."""
    if torch.jit.is_tracing():
        return torch.ops.tl.add_rms_norm(x, residual, weight, eps)
    return add_rms_norm_kernel(x, residual, weight, eps)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., q_heads * dim], k [..., k_heads * dim], cos and sin [..., dim] (the same
    leading dims, or broadcast to them) -> q and k rotated as transformers'
    apply_rotary_pos_emb does (x * cos + rotate_half(x) * sin, per head)."""
    if torch.jit.is_tracing():
        return torch.ops.tl.rope(q, k, cos, sin, dim)
    return rope_kernel(q, k, cos, sin, dim)


# The kernels of tl::rms_norm, tl::add_rms_norm and tl::rope; `lib`: the
# library to run (tests pass a mutant's), default the one built here.

def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, lib=None) -> torch.Tensor:
    return _norm(x, None, weight, eps, lib or kernel())[1]


def add_rms_norm_kernel(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float, lib=None) -> tuple[torch.Tensor, torch.Tensor]:
    return _norm(x, residual, weight, eps, lib or kernel())


def _norm(x, residual, weight, eps, lib) -> tuple[torch.Tensor | None, torch.Tensor]:
    n = x.shape[-1]
    flat, rows, stride = _rows(x)
    w = _rows(weight)[0]
    if w.shape != (n,):
        raise ValueError(f"an RMSNorm weight of {list(w.shape)} for rows of {n}")
    out = _out(x)
    total, res, res_stride = None, None, 0
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"a residual of {list(residual.shape)} for {list(x.shape)}")
        res, _, res_stride = _rows(residual)
        total = _out(x)
    lib.tl_rms_norm(flat.data_ptr(), stride, None if res is None else res.data_ptr(),
                    res_stride, w.data_ptr(), eps, rows, n,
                    None if total is None else total.data_ptr(), out.data_ptr(),
                    torch.get_num_threads())
    return total, out


def rope_kernel(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                dim: int, lib=None) -> tuple[torch.Tensor, torch.Tensor]:
    lib = lib or kernel()
    lead = q.shape[:-1]
    if (k.shape[:-1] != lead or dim <= 0 or dim % 2 or q.shape[-1] % dim
            or k.shape[-1] % dim or cos.shape[-1] != dim or sin.shape[-1] != dim):
        raise ValueError(f"rotary embedding of q {list(q.shape)} and k {list(k.shape)} in "
                         f"heads of {dim}")
    (qf, tokens, qs), (kf, _, ks) = _rows(q), _rows(k)
    c, s = _table(cos, lead, dim), _table(sin, lead, dim)
    qo, ko = _out(q), _out(k)
    lib.tl_rope(qf.data_ptr(), qs, q.shape[-1] // dim, kf.data_ptr(), ks, k.shape[-1] // dim,
                c.data_ptr(), s.data_ptr(), tokens, dim, qo.data_ptr(), ko.data_ptr(),
                torch.get_num_threads())
    return qo, ko


def _table(t: torch.Tensor, lead: torch.Size, dim: int) -> torch.Tensor:
    """cos or sin as [tokens, dim] contiguous (itself where it already is that)."""
    if t.shape[:-1] != lead:
        t = t.expand(*lead, dim)
    return _rows(t.contiguous())[0]
