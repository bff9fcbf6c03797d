"""The wire format under core/ipc/protocol.py: packed int arrays, the message registry, and
the one msgpack encoder/decoder.

A frame is a msgpack map {"t": TAG, field: value, ...}. Hot-path integer sequences
(I32/I64/F64) travel as msgpack bin of little-endian machine values, not as lists of ints.
`decode` checks the tag against the message types the socket accepts, rejects unknown and
missing fields and wrong types, and raises ProtocolError with an HTTP-like code.
No pickle anywhere.
"""
from __future__ import annotations

import sys
import types
import typing
from array import array
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Union

import msgpack

DEFAULT_MAX_FRAME_BYTES = 1 << 20
if sys.byteorder != "little":  # the bin encoding of arrays is little-endian by contract
    raise ImportError("tl-engine's wire format assumes a little-endian host")


class ProtocolError(Exception):
    """A frame that cannot be accepted: code 400 (malformed) or 413 (too large)."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Packed(array):
    TYPECODE = "i"

    def __new__(cls, data=()):
        if isinstance(data, (bytes, bytearray, memoryview)):
            arr = super().__new__(cls, cls.TYPECODE)
            arr.frombytes(data)
            return arr
        return super().__new__(cls, cls.TYPECODE, data)

    def __reduce__(self):  # keeps copy/deepcopy working for the subclass
        return (type(self), (self.tobytes(),))


class I32(_Packed):
    """int32 array: token ids, positions, slots, block ids."""
    TYPECODE = "i"


class I64(_Packed):
    """int64 array: seeds."""
    TYPECODE = "q"


class F64(_Packed):
    """float64 array: temperatures, top_p."""
    TYPECODE = "d"


_REGISTRY: dict[str, type] = {}


def message(tag: str):
    """Class decorator: a dataclass message with wire tag `tag`."""
    def wrap(cls):
        cls = dataclass(cls)
        if tag in _REGISTRY:
            raise ValueError(f"duplicate message tag {tag!r}")
        cls.TAG = tag
        _REGISTRY[tag] = cls
        return cls
    return wrap


def _to_wire(v: Any) -> Any:
    if isinstance(v, array):
        return v.tobytes()
    if is_dataclass(v):
        return {f.name: _to_wire(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, list):
        return [_to_wire(x) for x in v]
    return v


def encode(msg: Any) -> bytes:
    d = {"t": msg.TAG}
    for f in fields(msg):
        d[f.name] = _to_wire(getattr(msg, f.name))
    return msgpack.packb(d, use_bin_type=True)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


# A scalar type: what values it accepts (bool is no int or number here) and its name.
_SCALARS = {
    bool: (lambda v: isinstance(v, bool), "bool"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "int"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "number"),
    str: (lambda v: isinstance(v, str), "string"),
}


def _check(tp: Any, v: Any, where: str) -> Any:
    """Return v converted to tp, or raise ProtocolError(400)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for alt in typing.get_args(tp):
            try:
                return _check(alt, v, where)
            except ProtocolError:
                pass
        raise ProtocolError(400, f"{where}: wrong type {type(v).__name__}")
    if tp is type(None):
        if v is None:
            return None
        raise ProtocolError(400, f"{where}: expected null")
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        accepts, name = scalar
        if accepts(v):
            return float(v) if tp is float else v
        raise ProtocolError(400, f"{where}: expected {name}, got {type(v).__name__}")
    if tp is dict:
        if isinstance(v, dict):
            return v
        raise ProtocolError(400, f"{where}: expected map")
    if isinstance(tp, type) and issubclass(tp, _Packed):
        if not isinstance(v, bytes):
            raise ProtocolError(400, f"{where}: expected packed {tp.__name__} bytes")
        if len(v) % array(tp.TYPECODE).itemsize:
            raise ProtocolError(400, f"{where}: packed {tp.__name__} of odd length")
        return tp(v)
    if tp is list:
        tp, origin = list[Any], list
    if origin is list:
        if not isinstance(v, list):
            raise ProtocolError(400, f"{where}: expected list, got {type(v).__name__}")
        (item,) = typing.get_args(tp) or (Any,)
        if item is Any:
            return v
        return [_check(item, x, f"{where}[{i}]") for i, x in enumerate(v)]
    if is_dataclass(tp):
        if not isinstance(v, dict):
            raise ProtocolError(400, f"{where}: expected map for {tp.__name__}")
        return _build(tp, v, where)
    if tp is Any:
        return v
    raise ProtocolError(400, f"{where}: unsupported type {_type_name(tp)}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = typing.get_type_hints(cls)
    return h


def _build(cls: type, d: dict, where: str) -> Any:
    hints = _hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = [k for k in d if k != "t" and k not in known]
    if unknown:
        raise ProtocolError(400, f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    kwargs = {}
    for name, f in known.items():
        if name in d:
            kwargs[name] = _check(hints[name], d[name], f"{where}.{name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ProtocolError(400, f"{where}: missing field {name}")
    return cls(**kwargs)


def decode(data: bytes, accept: tuple[type, ...] | None = None,
           max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Decode one frame into its message; `accept` limits the types this socket takes."""
    if len(data) > max_bytes:
        raise ProtocolError(413, f"frame of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for junk
        raise ProtocolError(400, f"malformed frame: {type(e).__name__}") from None
    if not isinstance(d, dict):
        raise ProtocolError(400, "malformed frame: expected a map")
    tag = d.get("t")
    cls = _REGISTRY.get(tag) if isinstance(tag, str) else None
    if cls is None or (accept is not None and cls not in accept):
        raise ProtocolError(400, f"unexpected message type {tag!r}")
    return _build(cls, d, tag)
