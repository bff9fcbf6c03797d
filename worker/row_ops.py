"""The Llama family's small per-token ops in C (csrc/row_ops.c): RMSNorm (optionally after the
residual add), the rotary embedding of q and k, silu(gate) * up. Each replaces a dozen of
torch's calls (about 80 a layer in all on a one-row decode); worker/fused_llama.py puts them
in a model's modules. Every row is summed in one fixed order, whatever the call's rows.

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
    lib.tl_rope.argtypes = (_P, _I64, _P, _P, _I64, _I64, _I64, _P, _INT)
    lib.tl_silu_mul.argtypes = (_P, _I64, _P, _I64, _I64, _I64, _P, _INT)
    return lib


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with unit stride along the last dim (a view where it can be)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _check(*xs: torch.Tensor) -> None:
    for x in xs:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError(f"the native row ops take CPU float32, not {x.device} {x.dtype}")


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


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    if torch.jit.is_tracing():
        return torch.ops.tl.silu_mul(gate, up)
    return silu_mul_kernel(gate, up)


# The kernels of tl::rms_norm, tl::add_rms_norm, tl::rope and tl::silu_mul; `lib`: the
# library to run (tests pass a mutant's), default the one built here.

def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, lib=None) -> torch.Tensor:
    return _norm(x, None, weight, eps, lib or kernel())[1]


def add_rms_norm_kernel(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float, lib=None) -> tuple[torch.Tensor, torch.Tensor]:
    return _norm(x, residual, weight, eps, lib or kernel())


def _norm(x, residual, weight, eps, lib) -> tuple[torch.Tensor | None, torch.Tensor]:
    _check(x, weight)
    n = x.shape[-1]
    flat, w = _rows(x), weight.contiguous()
    if w.shape != (n,):
        raise ValueError(f"an RMSNorm weight of {list(w.shape)} for rows of {n}")
    out = torch.empty(flat.shape, dtype=torch.float32)
    total, res = None, None
    if residual is not None:
        _check(residual)
        if residual.shape != x.shape:
            raise ValueError(f"a residual of {list(residual.shape)} for {list(x.shape)}")
        res = _rows(residual)
        total = torch.empty(flat.shape, dtype=torch.float32)
    lib.tl_rms_norm(flat.data_ptr(), flat.stride(0), None if res is None else res.data_ptr(),
                    0 if res is None else res.stride(0), w.data_ptr(), eps, flat.shape[0], n,
                    None if total is None else total.data_ptr(), out.data_ptr(),
                    torch.get_num_threads())
    return (None if total is None else total.view(x.shape)), out.view(x.shape)


def rope_kernel(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                dim: int, lib=None) -> tuple[torch.Tensor, torch.Tensor]:
    lib = lib or kernel()
    _check(q, k, cos, sin)
    lead = q.shape[:-1]
    if (k.shape[:-1] != lead or dim % 2 or q.shape[-1] % dim or k.shape[-1] % dim
            or cos.shape[-1] != dim or sin.shape[-1] != dim):
        raise ValueError(f"rotary embedding of q {list(q.shape)} and k {list(k.shape)} in "
                         f"heads of {dim}")
    c, s = _table(cos, lead, dim), _table(sin, lead, dim)
    return _rope_one(q, c, s, dim, lib), _rope_one(k, c, s, dim, lib)


def _table(t: torch.Tensor, lead: torch.Size, dim: int) -> torch.Tensor:
    """cos or sin as [tokens, dim] contiguous (a view where it already is one)."""
    if t.shape[:-1] != lead:
        t = t.expand(*lead, dim)
    return t.reshape(-1, dim).contiguous()


def _rope_one(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, dim: int, lib) -> torch.Tensor:
    flat = _rows(x)
    out = torch.empty(flat.shape, dtype=torch.float32)
    lib.tl_rope(flat.data_ptr(), flat.stride(0), c.data_ptr(), s.data_ptr(), flat.shape[0],
                flat.shape[1] // dim, dim, out.data_ptr(), torch.get_num_threads())
    return out.view(x.shape)


def silu_mul_kernel(gate: torch.Tensor, up: torch.Tensor, lib=None) -> torch.Tensor:
    lib = lib or kernel()
    _check(gate, up)
    if gate.shape != up.shape:
        raise ValueError(f"silu(gate) * up of {list(gate.shape)} and {list(up.shape)}")
    g, u = _rows(gate), _rows(up)
    out = torch.empty(g.shape, dtype=torch.float32)
    lib.tl_silu_mul(g.data_ptr(), g.stride(0), u.data_ptr(), u.stride(0), g.shape[0],
                    g.shape[1], out.data_ptr(), torch.get_num_threads())
    return out.view(gate.shape)
