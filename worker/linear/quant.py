"""Linear layers on weights kept in GGUF's quantized blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 in
blocks of 32 weights; the K-quants Q4_K, Q5_K, Q6_K in super-blocks of 256): the C kernel
(worker/csrc/quant_gemm.c) multiplies float32 rows by them without unpacking them, every output
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
BLOCK = 32        # weights per block of the 32-weight types, the run every type's sum takes
INT8_ACTIVATIONS = 0x100   # a kernel type's flag: the int8 path (quant_int8.h)
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_id: int        # ggml's type number, what the kernel takes
    block_bytes: int    # fp16 scales, then the packed weights (ggml's layouts, quant_blocks.h)
    block: int = BLOCK  # weights per block: 32, or 256 for the K-quants' super-blocks


Q8_0 = QuantType("Q8_0", 8, 34)
Q4_0 = QuantType("Q4_0", 2, 18)
Q4_1 = QuantType("Q4_1", 3, 20)
Q5_0 = QuantType("Q5_0", 6, 22)
Q5_1 = QuantType("Q5_1", 7, 24)
Q4_K = QuantType("Q4_K", 12, 144, 256)
Q5_K = QuantType("Q5_K", 13, 176, 256)
Q6_K = QuantType("Q6_K", 14, 210, 256)
TYPES = {t.name: t for t in (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)}
BY_ID = {t.ggml_id: t for t in TYPES.values()}


@dataclass(frozen=True)
class QuantWeight:
    """An [out, in] weight as GGUF stores it: row n is in / qtype.block blocks of `qtype`,
    `data` [out, in / qtype.block * block_bytes] uint8 on the CPU."""
    data: torch.Tensor
    qtype: QuantType
    shape: tuple[int, int]

    def __post_init__(self):
        out, k = self.shape
        block = self.qtype.block
        if k <= 0 or k % block:
            raise ValueError(f"a {self.qtype.name} weight's input size must be a positive "
                             f"multiple of {block}, not {k}")
        want = (out, k // block * self.qtype.block_bytes)
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
    for fn in (lib.tl_quant_matmul, lib.tl_quant_matmul_bf16):
        fn.argtypes = (_P, _P, _INT, _P, _P, _I64, _I64, _I64, _INT)
        fn.restype = _INT
    lib.tl_quant_has_bf16.restype = _INT
    lib.tl_quant_has_int8.restype = _INT
    lib.tl_quant_int8_group.argtypes = (_INT, _I64)
    lib.tl_quant_int8_group.restype = _INT
    lib.tl_quant_isa.restype = ctypes.c_char_p
    return lib


def isa(lib=None) -> str | None:
    """The instruction set the kernel was built for: avx512, avx2 or scalar."""
    lib = lib or kernel()
    return None if lib is None else lib.tl_quant_isa().decode()


def has_bf16(lib=None) -> bool:
    """Whether the kernel has its bfloat16 path (built where the CPU has AVX512_BF16:
    quant_bf16.h)."""
    lib = lib or kernel()
    return lib is not None and bool(lib.tl_quant_has_bf16())


def has_int8(lib=None) -> bool:
    """Whether the kernel has its int8 path (built where the CPU has AVX2: quant_int8.h)."""
    lib = lib or kernel()
    return lib is not None and bool(lib.tl_quant_has_int8())


def int8_group(qtype: QuantType, k: int = 0, lib=None) -> int:
    """The values x is rounded to int8 in groups of where the int8 path multiplies a layer of
    `qtype` with rows of `k` weights (k = 0: of the type alone), else 0: the kernel's own
    answer (quant_int8.h), so that no list here can drift from it."""
    lib = lib or kernel()
    return 0 if lib is None else int(lib.tl_quant_int8_group(qtype.ggml_id, k))


def int8_types(lib=None) -> dict[str, int]:
    """The types the int8 path multiplies, each with its group (int8_group)."""
    return {t.name: g for t in TYPES.values() if (g := int8_group(t, 0, lib))}


def matmul(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
           lib=None, bf16: bool = False, int8: bool = False) -> torch.Tensor:
    """F.linear(x, dequantize(qw), bias) for float32 x [..., in]; through the C kernel
    (`lib`, default the one built here) where there is one. `bf16`: blocks_matmul's; `int8`:
    its type with the int8 flag (kernel_code)."""
    out, k = qw.shape
    if x.dtype != torch.float32:
        raise TypeError(f"a quantized linear layer takes float32 input, not {x.dtype}")
    if x.shape[-1] != k:
        raise ValueError(f"input of {x.shape[-1]} features for a weight of {k}")
    return blocks_matmul(x, qw.data, kernel_code(qw.qtype.ggml_id, int8), bias, lib, bf16)


def kernel_code(ggml_id: int, int8: bool) -> int:
    """What tl_quant_matmul (and the graph's tl::quant_linear) takes for a type: its ggml
    number, plus INT8_ACTIVATIONS for the int8 path (quant_int8.h)."""
    return ggml_id | INT8_ACTIVATIONS if int8 else ggml_id


def blocks_matmul(x: torch.Tensor, data: torch.Tensor, ggml_id: int,
                  bias: torch.Tensor | None = None, lib=None, bf16: bool = False) -> torch.Tensor:
    """matmul on a weight's bare blocks (`data` [out, in / block * block_bytes] uint8, type
    `ggml_id`): the kernel of the decode graph's op tl::quant_linear (worker/graph.py).
    `bf16`: x and the weights rounded to bfloat16 and multiplied so (`--prefill-bf16`:
    quant_bf16.h), where the kernel has that path (has_bf16), else a ValueError. `ggml_id`
    with the INT8_ACTIVATIONS flag (kernel_code): x rounded to int8 and multiplied in integers
    (`--int8-activations`: quant_int8.h), for the types that path has (int8_types; the others
    in float32). bf16 takes the call where both are asked."""
    int8 = bool(ggml_id & INT8_ACTIVATIONS)
    ggml_id &= ~INT8_ACTIVATIONS
    out, k = data.shape[0], x.shape[-1]
    lib = lib or kernel()
    if lib is None:
        if bf16 or int8:
            raise ValueError("the quantized kernel's " + ("bfloat16" if bf16 else "int8")
                             + " path is not built here")
        return F.linear(x, dequantize(QuantWeight(data, BY_ID[ggml_id], (out, k))), bias)
    # few torch calls: this runs for every layer of every step, from the decode graph too
    if not x.is_contiguous():
        x = x.contiguous()
    y = torch.empty((*x.shape[:-1], out), dtype=torch.float32)
    rows = x.numel() // k if k else 0
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    if rows and out:
        fn = lib.tl_quant_matmul_bf16 if bf16 else lib.tl_quant_matmul
        rc = fn(x.data_ptr(), data.data_ptr(), kernel_code(ggml_id, int8 and not bf16),
                None if bias is None else bias.data_ptr(), y.data_ptr(), rows, k, out,
                torch.get_num_threads())
        if rc != 0:   # y was not written: refuse, as the C++ kernel does (csrc/torch_ops.cpp)
            raise ValueError(f"quantized kernel refused type {ggml_id} [{out}, {k}] ({rc})")
    return y


def dequantize(qw: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [out, in] weight in `dtype`. In float64 every weight is exact; in float32 each is
    the float nearest its exact value, the very weights the kernel multiplies by and the bits
    gguf-py's dequantize gives: every product of a scale and a quant is exact in float32
    (at most 11 + 7 + 5 bits), so only an added min (Q4_1, Q5_1) or a subtracted one
    (Q4_K, Q5_K) rounds, once."""
    out, k = qw.shape
    blocks = qw.data.view(out, k // qw.qtype.block, qw.qtype.block_bytes)
    return _DECODE[qw.qtype.name](blocks, dtype).reshape(out, k)


def _q8_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _halves(b, 0).to(dtype) * b[..., 2:].view(torch.int8).to(dtype)


def _q4_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _halves(b, 0).to(dtype) * (nibbles(b[..., 2:]).to(dtype) - 8)


def _q4_1(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _halves(b, 0).to(dtype) * nibbles(b[..., 4:]).to(dtype) + _halves(b, 2).to(dtype)


def _fives(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 32 five-bit values: nibble j, plus 16 where bit j of the 4 bytes qh is set."""
    j = torch.arange(32)
    high = (qh.to(torch.int32)[..., j // 8] >> (j % 8)) & 1
    return nibbles(qs).to(torch.int32) | high << 4


def _q5_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _halves(b, 0).to(dtype) * (_fives(b[..., 2:6], b[..., 6:]) - 16).to(dtype)


def _q5_1(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _fives(b[..., 4:8], b[..., 8:]).to(dtype)
    return _halves(b, 0).to(dtype) * q + _halves(b, 2).to(dtype)


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's eight 6-bit sub-block scales and mins, packed in 12 bytes: bytes 0-3
    hold scales 0-3 (and the top 2 bits of scales 4-7), bytes 4-7 mins 0-3 (and the top bits
    of mins 4-7), bytes 8-11 the low nibbles of scales 4-7 and, high, of mins 4-7."""
    s = scales.to(torch.int32)
    sc, mn, low = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    return (torch.cat([sc & 63, (low & 15) | (sc >> 2 & 48)], dim=-1),
            torch.cat([mn & 63, (low >> 4) | (mn >> 2 & 48)], dim=-1))


def _k_runs(b: torch.Tensor, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Q4_K/Q5_K: run r's weights d * scale_r * q - dmin * min_r, q [..., 8, 32]."""
    sc, mn = _scale_min(b[..., 4:16])
    d = (_halves(b, 0).to(dtype) * sc.to(dtype))[..., None]
    m = (_halves(b, 2).to(dtype) * mn.to(dtype))[..., None]
    return d * q.to(dtype) - m


def _low_high(qs: torch.Tensor) -> torch.Tensor:
    """[..., 128] bytes -> [..., 8, 32] nibbles: run 2i the low nibbles of bytes 32i..32i+31,
    run 2i + 1 their high ones."""
    return nibbles(qs.reshape(*qs.shape[:-1], 4, 32)).reshape(*qs.shape[:-1], 8, 32)


def _q4_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _k_runs(b, _low_high(b[..., 16:144]), dtype)


def _q5_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bit r of qh byte l is the fifth bit of run r's weight l."""
    high = (b[..., None, 16:48].to(torch.int32) >> torch.arange(8)[:, None]) & 1
    return _k_runs(b, _low_high(b[..., 48:176]).to(torch.int32) | high << 4, dtype)


def _q6_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Two halves of 128 weights: 64 ql bytes (weights l and l + 64 from byte l's nibbles,
    l < 64) and 32 qh bytes (bits 2t, 2t + 1 of byte l: weight 32t + l's top two bits), then
    sixteen int8 scales of 16 weights and the fp16 d at byte 208: w = d * scale * (q - 32)."""
    lead = b.shape[:-1]
    low = nibbles(b[..., :128].reshape(*lead, 2, 64)).to(torch.int32)
    shifts = torch.arange(0, 8, 2)[:, None]
    high = (b[..., 128:192].reshape(*lead, 2, 1, 32).to(torch.int32) >> shifts) & 3
    q = (low | high.reshape(*lead, 2, 128) << 4) - 32
    d = _halves(b, 208).to(dtype) * b[..., 192:208].view(torch.int8).to(dtype)
    return d[..., None] * q.reshape(*lead, 16, 16).to(dtype)


_DECODE = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
           "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., n] packed bytes -> [..., 2n] values: the low nibbles, then the high ones (ggml's
    order: a Q4_0 block's weights 0..15, then 16..31)."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _halves(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at `offset` of every block, [out, blocks, 1]."""
    return blocks[..., offset:offset + 2].contiguous().view(torch.float16)
