"""The trained model as `Q4_K_M`, `Q5_K_M` and `Q6_K` files, made here without llama.cpp.

`llama-quantize` (a benchmark dependency CI does not build) turns SmolLM2-135M into these
mixes: a tensor whose rows are not whole 256-weight super-blocks (576 of smollm2's widths)
falls back to Q5_0 / Q5_1 / Q8_0, and attn_v and ffn_down take Q6_K in the "more bits"
layers. `mixed_file` writes the same mix of types from the registry file's own weights
(dequantized by gguf-py), with simple min/max quantizers for the K-quants below: the blocks
are valid and of the same layout as llama.cpp's (gguf-py's dequantizers read them), if not
the very values its search for scales would pick. The metadata is the registry file's, byte
for byte; only the tensor table and data are new.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

QK_K = 256
SCHEMES = {   # scheme -> (base type, "more bits" type, fallbacks for rows not whole super-blocks)
    "Q4_K_M": ("Q4_K", "Q6_K"),
    "Q5_K_M": ("Q5_K", "Q6_K"),
    "Q6_K": ("Q6_K", "Q6_K"),
}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def more_bits(layer: int, n_layers: int) -> bool:
    """llama-quantize's rule for the layers whose attn_v and ffn_down get more bits."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def tensor_type(name: str, row: int, n_layers: int, scheme: str) -> str | None:
    """The type `scheme` gives tensor `name` whose rows are `row` long (None: kept as is)."""
    parts = name.split(".")
    if name == "token_embd.weight":
        want = "Q6_K"
    elif len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in (
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        base, more = SCHEMES[scheme]
        want = more if parts[2] in ("attn_v", "ffn_down") and more_bits(
            int(parts[1]), n_layers) else base
    else:
        return None
    return want if row % QK_K == 0 else FALLBACK[want]


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _scale_min_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per super-block -> the 12 bytes gguf-py's get_scale_min reads."""
    lo = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    mid = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return np.concatenate([lo, mid, hi], axis=1).astype(np.uint8)


def _affine(x: np.ndarray, levels: int):
    """x [n, 8, 32] -> (d, dmin fp16-rounded [n], sc, m [n, 8] uint8, q [n, 8, 32])."""
    lo = np.minimum(x.min(axis=2), 0.0)
    step = (x.max(axis=2) - lo) / levels
    d = (step.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = (-lo.min(axis=1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(step / np.where(d > 0, d, 1)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / np.where(dmin > 0, dmin, 1)[:, None]), 0, 63).astype(np.uint8)
    scale = d[:, None] * sc
    q = np.rint((x + (dmin[:, None] * m)[..., None]) / np.where(scale > 0, scale, 1)[..., None])
    return d, dmin, sc, m, np.clip(q, 0, levels).astype(np.uint8)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    d, dmin, sc, m, q = _affine(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(len(x), 128)
    return np.concatenate([_fp16(d), _fp16(dmin), _scale_min_bytes(sc, m), qs], axis=1)


def quantize_q5_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    d, dmin, sc, m, q = _affine(x, 31)
    low = q & 15
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(len(x), 128)
    qh = sum(((q[:, j] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
    return np.concatenate([_fp16(d), _fp16(dmin), _scale_min_bytes(sc, m), qh, qs], axis=1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)
    step = np.abs(x).max(axis=2) / 31
    d = (step.max(axis=1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(step / np.where(d > 0, d, 1)[:, None]), -128, 127).astype(np.int8)
    scale = d[:, None] * sc
    q = np.rint(x / np.where(scale > 0, scale, 1)[..., None])
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(len(x), 2, 128)
    low, high = q & 15, q >> 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(len(x), 128)
    qh = sum(high[:, :, 32 * s:32 * s + 32] << (2 * s) for s in range(4))
    return np.concatenate([ql, qh.reshape(len(x), 64).astype(np.uint8),
                           sc.view(np.uint8), _fp16(d)], axis=1)


def quantized(floats: np.ndarray, qtype: str) -> np.ndarray:
    """[rows, k] float32 -> [rows, bytes] uint8 blocks of `qtype`."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType
    rows = floats.shape[0]
    own = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}.get(qtype)
    if own is not None:
        return own(floats.astype(np.float32)).reshape(rows, -1)
    return quants.quantize(floats.astype(np.float32), GGMLQuantizationType[qtype])


def mixed_file(src: Path, out: Path, scheme: str) -> Path:
    """`src` (a llama GGUF) re-quantized as `scheme` into `out`, unless already there."""
    if out.is_file():
        return out
    from gguf import GGUFReader, quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    r = GGUFReader(str(src))
    n_layers = int(r.fields["llama.block_count"].parts[-1][0])
    blobs = []
    for t in r.tensors:
        row = int(t.shape[0])
        qtype = tensor_type(t.name, row, n_layers, scheme)
        if qtype is None:
            blobs.append((t, t.tensor_type, np.asarray(t.data).view(np.uint8)))
            continue
        floats = quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(-1, row)
        blobs.append((t, GGMLQuantizationType[qtype], quantized(floats, qtype)))
    tmp = out.with_suffix(".tmp")
    _write(src, tmp, r, blobs, GGML_QUANT_SIZES)
    tmp.replace(out)
    return out


def _write(src: Path, out: Path, reader, blobs, sizes) -> None:
    """The header and metadata of `src` as they are, then a new tensor table and data."""
    align = reader.alignment
    head = src.open("rb").read(min(t.field.offset for t in reader.tensors))
    infos, offset = [], 0
    for t, qtype, data in blobs:
        name = t.name.encode()
        dims = [int(d) for d in t.shape]
        infos.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
                     + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", qtype, offset))
        block, size = sizes[qtype]
        if data.size != int(np.prod(dims)) // block * size:
            raise ValueError(f"{t.name}: {data.size} bytes for {dims} of {qtype.name}")
        offset += -(-data.size // align) * align
    with out.open("wb") as f:
        f.write(head)
        f.write(b"".join(infos))
        f.write(b"\0" * (-f.tell() % align))
        for _, _, data in blobs:
            f.write(np.ascontiguousarray(data).tobytes())
            f.write(b"\0" * (-f.tell() % align))
