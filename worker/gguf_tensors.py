"""A GGUF file's tensors used in place: the file is mapped copy-on-write (private: nothing
the process does reaches the file) and each tensor is a torch tensor viewing the map
(torch.frombuffer), so blocks served as stored cost no copy, and no read until a forward
touches their pages. The tensor keeps the map alive; the map is never closed by hand.

Only what must be rewritten is copied: rows the converter permuted (worker/gguf_names.py),
float16/bfloat16 tensors made float32, and blocks of a type without a kernel made float.
"""
from __future__ import annotations

import mmap
from itertools import chain
from pathlib import Path

import numpy as np
import torch
from torch import nn

from worker.gguf_index import GgufIndex, TensorInfo, read_index
from worker.gguf_names import parameter_name, permuted_heads, unpermute

FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class GgufTensors:
    """The file's index and its map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.index: GgufIndex = read_index(self.path)
        if self.index.big_endian:
            raise ValueError(f"{self.path.name}: a big-endian GGUF file's tensors are not "
                             "read in place (this CPU is little-endian)")
        with open(self.path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)

    def raw(self, t: TensorInfo) -> torch.Tensor:
        """uint8 [rows, bytes per row], viewing the map."""
        return (torch.frombuffer(self.map, dtype=torch.uint8, count=t.n_bytes, offset=t.offset)
                .view(t.byte_shape))

    def floats(self, t: TensorInfo) -> torch.Tensor:
        """The tensor as float32, rows first (the map itself where the file holds F32)."""
        shape = t.dims[::-1]
        dtype = FLOATS.get(t.type_name)
        if dtype is None:   # blocks no kernel multiplies: gguf-py's decoding
            from worker.requantize import decoded
            rows = decoded(self.raw(t).numpy(), t.type_name)
            return torch.from_numpy(np.ascontiguousarray(rows, np.float32)).view(shape)
        count = t.n_bytes // dtype.itemsize
        view = torch.frombuffer(self.map, dtype=dtype, count=count, offset=t.offset).view(shape)
        return view.float()   # no copy when already float32

    def read_parameters(self, model: nn.Module, wanted: dict[str, torch.Tensor],
                        architecture: str) -> dict[str, torch.Tensor]:
        """The tensors of the file that are parameters in `wanted` (name -> the model's empty
        tensor), by their GGUF names, as float32 in transformers' row order."""
        found = {}
        for t in self.index.tensors:
            name = parameter_name(t.name)
            if name not in wanted:
                continue
            value = self.floats(t)
            if n_head := permuted_heads(t.name, architecture, model.config):
                value = torch.from_numpy(np.ascontiguousarray(unpermute(value.numpy(), n_head)))
            if value.shape != wanted[name].shape:
                raise ValueError(f"{t.name}: the GGUF tensor is {list(value.shape)}, the "
                                 f"model's {name} {list(wanted[name].shape)}")
            found[name] = value
        return found

    def release_unused(self, model: nn.Module) -> int:
        """Drop from this process the map's pages that no tensor of `model` views any more
        (blocks copied into fused siblings or put back in order, re-quantized tensors, the
        metadata): they were read once at load and would otherwise count in its resident
        memory. The mapping is private and never written, so a page touched again is read
        back from the file: nothing can read wrong bytes. The bytes released."""
        start = torch.frombuffer(self.map, dtype=torch.uint8, count=1).data_ptr()
        end = start + len(self.map)
        used = sorted({(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in
                       (t.untyped_storage() for t in chain(model.parameters(), model.buffers()))
                       if start <= s.data_ptr() < end})
        released, at = 0, 0
        for lo, hi in [*used, (end, end)]:
            released += self._drop(at, lo - start)
            at = max(at, hi - start)
        return released

    def _drop(self, lo: int, hi: int) -> int:
        """madvise(DONTNEED) the whole pages within [lo, hi) of the map."""
        page = mmap.PAGESIZE
        lo, hi = -(-lo // page) * page, hi // page * page
        if hi <= lo:
            return 0
        self.map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return hi - lo
