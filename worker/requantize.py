"""GGUF tensor types the kernel has no code for (Q2_K, Q3_K: the kernel multiplies Q5_0, Q5_1,
Q4_K, Q5_K and Q6_K natively, worker/linear/quant.py), re-quantized at load to Q8_0, the
native type nearest above them in precision (docs/design/cpu-paths.md, "Quantized weights").

Each block is decoded with gguf-py's reference dequantizer (the very float weights the
converted checkpoint holds) and quantized again with ggml's Q8_0 quantizer
(worker/linear/quantize.py). The cost is named once at load: the weights are no longer the
file's bit for bit (each within half a Q8_0 step of its 32-weight block, amax / 254, plus
the step's fp16 rounding), and a
token reads more bytes than the file's blocks would (Q8_0 is 8.5 bits a weight).
"""
from __future__ import annotations

import numpy as np
import torch

from worker.linear.quant import Q8_0, QuantWeight
from worker.linear.quantize import quantize

# bits a weight of each type re-quantized here (ggml's block sizes)
BITS = {"Q2_K": 2.625, "Q3_K": 3.4375}
TARGET = Q8_0
TARGET_BITS = 8.5


def requantizable(type_name: str) -> bool:
    return type_name in BITS


def decoded(raw: np.ndarray, type_name: str) -> np.ndarray:
    """The float32 weights of a tensor's raw blocks (`raw` [rows, bytes per row] uint8)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    return dequantize(np.ascontiguousarray(raw), GGMLQuantizationType[type_name])


def to_q8_0(weights: np.ndarray) -> QuantWeight:
    """[out, in] float32 (rows already in transformers' order) as Q8_0 blocks."""
    return quantize(torch.from_numpy(np.array(weights, dtype=np.float32, copy=True)), TARGET)


def warning(path_name: str, types: set[str]) -> str:
    """The one line that names the cost."""
    each = ", ".join(f"{t} ({TARGET_BITS / BITS[t]:.1f}x its bytes)" for t in sorted(types))
    return (f"{path_name}: tensors of {each} are re-quantized to {TARGET.name} at load (no "
            f"kernel for them): each weight within half a {TARGET.name} step of the file's, "
            "not bit for bit; --dequantize serves the file's own weights as float32")
