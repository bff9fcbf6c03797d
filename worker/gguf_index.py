"""A GGUF file's scalar metadata and tensor table, read without its metadata arrays.

gguf-py's GGUFReader makes numpy objects for every element of every metadata array: on the
registry model (a 49,152-token vocabulary and its merges) that is ~150 MB of Python objects
for a moment, and the heap they fragment stays with the worker. The engine reads the scalars
and the tensor table; arrays are stepped over, their lengths kept (the vocabulary's). The
layout read is gguf-py's (versions 2 and 3, either byte order); the tensors' bytes are used
where they lie (worker/gguf_tensors.py).
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF's value types: struct formats of the scalars (strings and arrays are read apart)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str            # ggml's type name (gguf-py's GGMLQuantizationType)
    dims: tuple[int, ...]     # ggml's order: dims[0] is the length of a row
    offset: int               # of its first byte in the file
    n_bytes: int

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """The shape gguf-py gives the tensor's data: rows first, a row as its bytes."""
        rows = self.dims[::-1]
        return (*rows[:-1], self.n_bytes // max(1, math.prod(rows[:-1])))


@dataclass(frozen=True)
class GgufIndex:
    fields: dict            # key -> value of every scalar or string field (arrays stepped over)
    tensors: tuple[TensorInfo, ...]
    size: int               # of the file, in bytes
    array_lengths: dict     # key -> how many items each array field holds
    big_endian: bool        # the file's numbers, its tensors' among them


def read_index(path: str | Path) -> GgufIndex:
    """The file's index. ValueError("bad magic") for a file that is not GGUF; struct.error,
    IndexError or ValueError for one cut short or damaged."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != MAGIC:
            raise ValueError("bad magic number")
        return _Parser(m).index(len(m))


class _Parser:
    def __init__(self, data):
        self.data, self.at = data, 4
        version = struct.unpack_from("<I", data, 4)[0]
        self.order = ">" if version & 0xFFFF == 0 else "<"   # written on the other byte order
        if self._scalar("I") not in VERSIONS:
            raise ValueError(f"GGUF version {version} is not read (only {VERSIONS})")

    def index(self, size: int) -> GgufIndex:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        n_tensors, n_fields = self._scalar("Q"), self._scalar("Q")
        fields, arrays = {}, {}
        for _ in range(n_fields):
            key, kind = self._string(), self._scalar("I")
            value = self._value(kind)
            if kind == ARRAY:
                arrays[key] = value
            else:
                fields[key] = value
        table = [(self._string(), tuple(self._scalar("Q") for _ in range(self._scalar("I"))),
                  self._scalar("I"), self._scalar("Q")) for _ in range(n_tensors)]
        if len({t[0] for t in table}) != len(table):
            raise ValueError("a tensor name is used twice")
        align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ValueError(f"bad general.alignment {align!r}")
        start = -(-self.at // align) * align
        tensors = []
        for name, dims, type_id, offset in table:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
            tensors.append(TensorInfo(name, qtype.name, dims, start + offset,
                                      math.prod(dims) * type_size // block))
        return GgufIndex(fields, tuple(tensors), size, arrays, self.order == ">")

    def _scalar(self, fmt: str):
        value = struct.unpack_from(self.order + fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        start = self._skip_string()
        return self.data[start:self.at].decode("utf-8", errors="replace")

    def _skip_string(self) -> int:
        """Steps over a string; where it starts."""
        n = self._scalar("Q")
        start, self.at = self.at, self.at + n
        if self.at > len(self.data):
            raise IndexError("a string runs past the end of the file")
        return start

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind in SCALARS:
            return self._scalar(SCALARS[kind])
        if kind != ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self._skip_array()

    def _skip_array(self) -> int:
        """Steps over an array; how many items it holds."""
        item, count = self._scalar("I"), self._scalar("Q")
        if item in SCALARS:   # fixed-size items: stepped over at once
            self.at += count * struct.calcsize(SCALARS[item])
        elif item == STRING:
            for _ in range(count):
                self._skip_string()
        else:
            for _ in range(count):
                self._value(item)
        return count

