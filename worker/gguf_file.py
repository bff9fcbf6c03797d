"""A GGUF file checked before anything loads from it: readable, whole, of an architecture and
tensor types the engine serves, its metadata's model sizes those of its tensors
(worker/gguf_metadata.py). One line names the first problem (ValueError); nothing
half-loaded ever serves (docs/design/worker.md, "GGUF files")."""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from worker import gguf_metadata
from worker.gguf_index import GgufIndex, read_index

# GGUF's general.architecture -> the transformers model_type it loads as. Only those both
# transformers' GGUF reader and the paged attention (worker/archs.py) serve.
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                 "phi3": "phi3", "gemma2": "gemma2", "starcoder2": "starcoder2", "gpt2": "gpt2"}
# Tensor types gguf-py dequantizes (float and the block quantizations of llama.cpp).
TENSOR_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


@dataclass(frozen=True)
class GgufFacts:
    path: str
    sha256: str
    architecture: str
    tensor_types: dict        # type name -> how many tensors have it

    def as_checkpoint(self) -> dict:
        """What ModelInfo.checkpoint (and so the step log's meta) records of the file."""
        return {"format": "gguf", **asdict(self)}


def inspect(path: str | Path, pinned: bool = False) -> GgufFacts:
    """The file's facts, or ValueError naming the first problem. `pinned`: its sha256 is
    checked against a pin, so it is computed from the bytes, never remembered."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    index = read(path)
    arch = _field(index, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path.name}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    types = Counter(t.type_name for t in index.tensors)
    bad = sorted(set(types) - TENSOR_TYPES)
    if bad:
        raise ValueError(f"{path.name}: GGUF tensor type {bad[0]} is not supported "
                         f"(supported: {', '.join(sorted(TENSOR_TYPES))})")
    _check_whole(path, index)
    try:
        gguf_metadata.check(index, arch)
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None
    digest = hash_file(path) if pinned else sha256_of(path)
    return GgufFacts(str(path), digest, arch, dict(sorted(types.items())))


def read(path: Path) -> GgufIndex:
    """The file's index (worker/gguf_index.py), or ValueError in one line."""
    try:
        return read_index(path)
    except Exception as e:   # a damaged file fails wherever the parse runs out
        if "magic" in str(e).lower():
            raise ValueError(f"{path.name}: not a GGUF file (bad magic number)") from None
        raise ValueError(f"{path.name}: not a readable GGUF file (truncated or damaged: "
                         f"{type(e).__name__}: {e})") from None


def _field(index: GgufIndex, key: str):
    if key not in index.fields:
        raise ValueError(f"GGUF metadata has no {key!r}")
    return index.fields[key]


def _check_whole(path: Path, index: GgufIndex) -> None:
    size = index.size
    if not index.tensors:
        raise ValueError(f"{path.name}: the GGUF file holds no tensors")
    end = max(t.offset + t.n_bytes for t in index.tensors)
    if end > size:
        raise ValueError(f"{path.name}: truncated: its tensors end at byte {end}, the file "
                         f"has {size}")


def sha256_of(path: Path) -> str:
    """The file's sha256, remembered in a small JSON keyed by the file's inode, size, mtime
    and ctime, so a multi-GB file is hashed once, not at every start. The ctime is the
    kernel's: a file replaced by another of the same size with its mtime set back has a new
    one, so the old digest is not served for it."""
    st = path.stat()
    key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    memo = _memo_path(path)
    try:
        saved = json.loads(memo.read_text())
        if saved.get("key") == key:
            return saved["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = hash_file(path)
    _save_memo(memo, {"key": key, "sha256": digest})
    return digest


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _memo_path(path: Path) -> Path:
    from worker.presets import cache_root
    name = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return cache_root().parent / "gguf-sha256" / f"{name}.json"


def _save_memo(memo: Path, data: dict) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, memo)
    except OSError:   # a read-only cache only costs a re-hash next time
        pass
