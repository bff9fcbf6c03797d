"""Linear layers on weights kept in GGUF's quantized blocks (Q8_0, Q4_0, Q4_1): the C kernel
(csrc/quant_gemm.c) multiplies float32 rows by them without unpacking them, every output
summed in one fixed order (docs/design/cpu-paths.md, "Quantized weights"). Without the
kernel (no C compiler, TL_NATIVE=0) `matmul` dequantizes and calls F.linear: the same
weights, another summation order.

The worker serves a quantized GGUF's layers on them (worker/quantized.py).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

from worker import native

SOURCE = Path(__file__).parent.parent / "csrc" / "quant_gemm.c"
LIBS = ("-lm",)   # fmaf, where the CPU has no FMA instructions
BLOCK = 32        # weights per block, every type here
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_id: int        # ggml's type number, what the kernel takes
    block_bytes: int    # fp16 scale (and Q4_1's fp16 min), then the packed weights


Q8_0 = QuantType("Q8_0", 8, 34)
Q4_0 = QuantType("Q4_0", 2, 18)
Q4_1 = QuantType("Q4_1", 3, 20)
TYPES = {t.name: t for t in (Q8_0, Q4_0, Q4_1)}
BY_ID = {t.ggml_id: t for t in TYPES.values()}


@dataclass(frozen=True)
class QuantWeight:
    """An [out, in] weight as GGUF stores it: row n is in / 32 blocks of `qtype`, `data`
    [out, in / 32 * block_bytes] uint8 on the CPU."""
    data: torch.Tensor
    qtype: QuantType
    shape: tuple[int, int]

    def __post_init__(self):
        out, k = self.shape
        if k <= 0 or k % BLOCK:
            raise ValueError(f"a {self.qtype.name} weight's input size must be a positive "
                             f"multiple of {BLOCK}, not {k}")
        want = (out, k // BLOCK * self.qtype.block_bytes)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(f"a {self.qtype.name} weight of shape {self.shape} is uint8 "
                             f"{list(want)}, not {self.data.dtype} {list(self.data.shape)}")
        if self.data.device.type != "cpu" or not self.data.is_contiguous():
            raise ValueError("a quantized weight's blocks are one contiguous CPU tensor")


@cache
def kernel():
    """The loaded library, or None with one line on stderr saying why."""
    return load() if native.enabled() else None


def load(flags: tuple[str, ...] = ()):
    """The kernel built with `flags` besides native's (tests build the AVX2 and scalar
    paths with -mno-avx512f, -mno-avx), or None with one line on stderr saying why."""
    lib = native.load(SOURCE, "quantized linear layers unavailable, using torch",
                      (*flags, *LIBS))
    if lib is None:
        return None
    lib.tl_quant_matmul.argtypes = (_P, _P, _INT, _P, _P, _I64, _I64, _I64, _INT)
    lib.tl_quant_matmul.restype = _INT
    lib.tl_quant_isa.restype = ctypes.c_char_p
    return lib


def isa(lib=None) -> str | None:
    """The instruction set the kernel was built for: avx512, avx2 or scalar."""
    lib = lib or kernel()
    return None if lib is None else lib.tl_quant_isa().decode()


def matmul(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
           lib=None) -> torch.Tensor:
    """F.linear(x, dequantize(qw), bias) for float32 x [..., in]; through the C kernel
    (`lib`, default the one built here) where there is one."""
    out, k = qw.shape
    if x.dtype != torch.float32:
        raise TypeError(f"a quantized linear layer takes float32 input, not {x.dtype}")
    if x.shape[-1] != k:
        raise ValueError(f"input of {x.shape[-1]} features for a weight of {k}")
    return blocks_matmul(x, qw.data, qw.qtype.ggml_id, bias, lib)


def blocks_matmul(x: torch.Tensor, data: torch.Tensor, ggml_id: int,
                  bias: torch.Tensor | None = None, lib=None) -> torch.Tensor:
    """matmul on a weight's bare blocks (`data` [out, in / 32 * block_bytes] uint8, type
    `ggml_id`): the kernel of the decode graph's op tl::quant_linear (worker/graph.py)."""
    out, k = data.shape[0], x.shape[-1]
    lib = lib or kernel()
    if lib is None:
        return F.linear(x, dequantize(QuantWeight(data, BY_ID[ggml_id], (out, k))), bias)
    # few torch calls: this runs for every layer of every step, from the decode graph too
    if not x.is_contiguous():
        x = x.contiguous()
    y = torch.empty((*x.shape[:-1], out), dtype=torch.float32)
    rows = x.numel() // k if k else 0
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    if rows and out:
        rc = lib.tl_quant_matmul(x.data_ptr(), data.data_ptr(), ggml_id,
                                 None if bias is None else bias.data_ptr(), y.data_ptr(),
                                 rows, k, out, torch.get_num_threads())
        if rc != 0:   # y was not written: refuse, as the C++ kernel does (csrc/torch_ops.cpp)
            raise ValueError(f"quantized kernel refused type {ggml_id} [{out}, {k}] ({rc})")
    return y


def dequantize(qw: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [out, in] weight in `dtype`. In float64 every weight is exact; in float32 each is
    the float nearest its exact value (d * q is exact, so one rounding at most), the very
    weights the kernel multiplies by."""
    out, k = qw.shape
    blocks = qw.data.view(out, k // BLOCK, qw.qtype.block_bytes)
    d = _halves(blocks, 0).to(dtype)
    if qw.qtype is Q8_0:
        return (d * blocks[..., 2:].view(torch.int8).to(dtype)).view(out, k)
    q = nibbles(blocks[..., 4:] if qw.qtype is Q4_1 else blocks[..., 2:]).to(dtype)
    if qw.qtype is Q4_0:
        return (d * (q - 8)).view(out, k)
    return (d * q + _halves(blocks, 2).to(dtype)).view(out, k)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] packed bytes -> [..., 32] values: low nibbles are 0..15, high 16..31 (ggml)."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _halves(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at `offset` of every block, [out, blocks, 1]."""
    return blocks[..., offset:offset + 2].contiguous().view(torch.float16)
