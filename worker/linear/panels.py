"""Linear layers on the C panel kernel (worker/csrc/panel_gemm.c; docs/design/cpu-paths.md, "Panel linear
layers"): the weight laid out once in panels of NR output columns, multiplied by a kernel
that reads it front to back and sums every output in one fixed order.

Two things follow. A decode step's few rows read the weights at the machine's bandwidth
(oneDNN's packed path and MKL run their small-M calls at half of it or less here). And a
row's result does not depend on the call's other rows, so the batch-invariant mode needs
no row padding on these layers. Weights whose output count is not a multiple of NR, and
machines without a C compiler or AVX-512 (or TL_PANELS=0), keep oneDNN's packed path (worker/linear/packed.py).
"""
from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from pathlib import Path

import torch

from worker import native

SOURCE = Path(__file__).parent.parent / "csrc" / "panel_gemm.c"
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def enabled() -> bool:
    return os.environ.get("TL_PANELS", "1") != "0" and native.enabled()


def _vector_width_ok() -> bool:
    """The kernel's register blocks (12 rows x 32 columns) need AVX-512's 32 wide registers:
    with AVX2 alone they spill on every k, and a 64-row call ran 12x slower than oneDNN on an
    AVX2 EPYC. Elsewhere oneDNN keeps the layers."""
    return "avx512f" in native.cpu_flags().split()


@cache
def kernel():
    """The loaded library, or None with one line on stderr saying why."""
    if not enabled():
        return None
    if not _vector_width_ok():
        print("[worker] panel linear layers need AVX-512 (this CPU has none), using oneDNN",
              file=sys.stderr, flush=True)
        return None
    lib = native.load(SOURCE, "panel linear layers unavailable, using oneDNN")
    if lib is None:
        return None
    lib.tl_panels_pack.argtypes = (_P, _P, _I64, _I64, _INT)
    lib.tl_panels_linear.argtypes = (_P, _P, _P, _P, _I64, _I64, _I64, _INT)
    lib.tl_panel_width.restype = _INT
    return lib


@cache
def width() -> int:
    return kernel().tl_panel_width()


def fits(weight: torch.Tensor) -> bool:
    """A CPU fp32 [out, in] weight with out a multiple of the panel width, kernel built."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.dim() == 2 and kernel() is not None
            and weight.shape[0] % width() == 0)


def is_panels(weight: torch.Tensor) -> bool:
    """A weight of `pack`: [out / NR, in, NR] (an nn.Linear's own weight is 2-D)."""
    return weight.dim() == 3


def features(weight: torch.Tensor) -> tuple[int, int]:
    """(out, in) of the [out, in] weight that `pack` laid out as `weight`."""
    return weight.shape[0] * weight.shape[2], weight.shape[1]


def pack(weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach().contiguous()
    n, k = w.shape
    out = torch.empty(n // width(), k, width(), dtype=w.dtype)
    kernel().tl_panels_pack(w.data_ptr(), out.data_ptr(), n, k, torch.get_num_threads())
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, bias) for w packed by `pack`."""
    if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
        return torch.ops.tl.panel_linear(x, weight, bias)
    return panel_linear(x, weight, bias)


def panel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dtype != weight.dtype:
        raise TypeError(f"a panel linear layer of {weight.dtype} takes no {x.dtype} input")
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k).contiguous()
    n = features(weight)[0]
    out = torch.empty(flat.shape[0], n, dtype=x.dtype)
    if flat.shape[0]:
        b = None if bias is None else bias.contiguous()
        kernel().tl_panels_linear(flat.data_ptr(), weight.data_ptr(),
                                  None if b is None else b.data_ptr(), out.data_ptr(),
                                  flat.shape[0], k, n, torch.get_num_threads())
    return out.view(*lead, n)
