"""GGUF files damaged on purpose, for the refusal tests: copies of the registry model with
one field patched in place (same length, so the rest of the file still parses)."""
from __future__ import annotations

import struct
from pathlib import Path

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
