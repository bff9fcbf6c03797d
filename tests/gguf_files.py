"""GGUF files made from the registry model for tests: copies damaged on purpose, for the
refusal tests (one field patched in place, same length, so the rest of the file still
parses), a copy with some tensors stored as float, and transformers' own reading of a file.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from worker.registry_models import gguf_path


def smollm2() -> Path:
    """The registry model's GGUF file (fetched once into the cache)."""
    return gguf_path("smollm2")


def patched(out: Path, old: bytes, new: bytes, after: bytes = b"") -> Path:
    """A copy of the smollm2 file with the first `old` found after `after` replaced."""
    data = bytearray(smollm2().read_bytes())
    at = data.index(old, data.index(after) if after else 0)
    data[at:at + len(old)] = new
    out.write_bytes(bytes(data))
    return out


def with_architecture(out: Path, arch: bytes) -> Path:
    """general.architecture = arch (5 bytes, as "llama" is)."""
    key = b"general.architecture"
    return patched(out, b"llama", arch, after=key)


def with_tensor_type(out: Path, name: bytes, ggml_type: int) -> Path:
    """The tensor `name` (1-D) declared as ggml_type: its info is the name, n_dims (u32),
    the dims (u64 each), then the type (u32)."""
    data = smollm2().read_bytes()
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    old = data[type_at:type_at + 4]
    return patched(out, data[at:type_at] + old, data[at:type_at] + struct.pack("<I", ggml_type),
                   after=name)


def truncated(out: Path, keep: int) -> Path:
    out.write_bytes(smollm2().read_bytes()[:keep])
    return out


def with_scalar(out: Path, key: str, value: int) -> Path:
    """The u32 metadata field `key` (e.g. llama.block_count) set to `value`: its entry is
    the key, its type (u32) and the value."""
    data = smollm2().read_bytes()
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    if struct.unpack_from("<I", data, at)[0] != 4:
        raise ValueError(f"{key} is not a u32 field")
    old = data[at:at + 8]
    return patched(out, old, old[:4] + struct.pack("<I", value), after=name)


def with_float_tensors(out: Path, names: set[str], dtype=np.float16) -> Path:
    """A copy of the smollm2 file, written anew, with the tensors `names` stored as float
    (`dtype`: F16 or F32) in its own row order; everything else as it was."""
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(smollm2())
    writer = gguf.GGUFWriter(out, arch="llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        data = t.data
        if t.name in names:
            data = dequantize(t.data, t.tensor_type).astype(dtype)
            kind = gguf.GGMLQuantizationType.F16 if dtype == np.float16 else \
                gguf.GGMLQuantizationType.F32
        else:
            kind = t.tensor_type
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, kind)
        tensors.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return out


def transformers_model(path: Path):
    """transformers' own reading of a GGUF file: every tensor dequantized to float32."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                attn_implementation="sdpa").eval()
