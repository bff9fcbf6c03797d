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
from functools import cache
from typing import Any, Callable, Union

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


class F32(_Packed):
    """float32 array: pooled hidden states (embeddings)."""
    TYPECODE = "f"


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


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _wire_value(v: Any) -> Any:
    """msgpack's hook for what it cannot pack itself: packed arrays as their bytes, a
    dataclass (a nested message part) as a map of its fields. msgpack packs the rest
    (str, int, float, bool, None, bytes, lists, tuples, dicts) and walks into what this
    returns, so a message is packed in one pass of C, not walked in Python first."""
    if isinstance(v, array):
        return v.tobytes()
    if is_dataclass(v) and not isinstance(v, type):
        return {name: getattr(v, name) for name in _names(type(v))}
    raise TypeError(f"can not serialize {type(v).__name__!r} object")


def _as_map(msg: Any) -> dict:
    d = {"t": msg.TAG}
    for name in _names(type(msg)):
        d[name] = getattr(msg, name)
    return d


def encode(msg: Any) -> bytes:
    return msgpack.packb(_as_map(msg), use_bin_type=True, default=_wire_value)


class Encoder:
    """encode() with one msgpack Packer kept, for the thread that owns a socket (a Packer
    is not thread-safe): the frontend encodes ~1e5 deltas a second, and making a Packer
    was a third of a delta's encode."""

    def __init__(self):
        self._packer = msgpack.Packer(use_bin_type=True, default=_wire_value)

    def __call__(self, msg: Any) -> bytes:
        return self._packer.pack(_as_map(msg))   # a failed pack leaves the Packer empty


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


# A scalar type: what values it accepts (bool is no int or number here) and its name.
_SCALARS = {
    bool: (lambda v: isinstance(v, bool), "bool"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "int"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "number"),
    str: (lambda v: isinstance(v, str), "string"),
}


Checker = Callable[[Any, str], Any]   # (value, where) -> the value as tp, or ProtocolError(400)


@cache
def _checker(tp: Any) -> Checker:
    """The check for type tp, worked out once: decode runs ~1e5 times a second in the
    frontend and the clients, on a handful of message types."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union(typing.get_args(tp))
    if tp is type(None):
        return _null
    if tp in _SCALARS:
        return _scalar(tp)
    if tp is dict:
        return _map
    if isinstance(tp, type) and issubclass(tp, _Packed):
        return _packed(tp)
    if tp is list:
        tp, origin = list[Any], list
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return _list(item)
    if is_dataclass(tp):
        return _nested(tp)
    if tp is Any:
        return lambda v, where: v
    return _unsupported(tp)


def _union(alts: tuple) -> Checker:
    checks = [_checker(a) for a in alts]
    takes_none = type(None) in alts

    def check(v, where):
        if v is None and takes_none:   # what trying each in turn would give, sooner
            return None
        for alt in checks:
            try:
                return alt(v, where)
            except ProtocolError:
                pass
        raise ProtocolError(400, f"{where}: wrong type {type(v).__name__}")
    return check


def _null(v, where):
    if v is None:
        return None
    raise ProtocolError(400, f"{where}: expected null")


def _scalar(tp: type) -> Checker:
    accepts, name = _SCALARS[tp]

    def check(v, where):
        if accepts(v):
            return float(v) if tp is float else v
        raise ProtocolError(400, f"{where}: expected {name}, got {type(v).__name__}")
    return check


def _map(v, where):
    if isinstance(v, dict):
        return v
    raise ProtocolError(400, f"{where}: expected map")


def _packed(tp: type) -> Checker:
    size = array(tp.TYPECODE).itemsize

    def check(v, where):
        if not isinstance(v, bytes):
            raise ProtocolError(400, f"{where}: expected packed {tp.__name__} bytes")
        if len(v) % size:
            raise ProtocolError(400, f"{where}: packed {tp.__name__} of odd length")
        return tp(v)
    return check


_EXACT = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}   # bool is no int


def _list(item: Any) -> Checker:
    exact = _EXACT.get(item)
    each = None if item is Any else _checker(item)

    def check(v, where):
        if not isinstance(v, list):
            raise ProtocolError(400, f"{where}: expected list, got {type(v).__name__}")
        if each is None:
            return v
        if exact is not None and all(type(x) in exact for x in v):   # the common case
            return [float(x) for x in v] if item is float else v
        return [each(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return check


def _nested(tp: type) -> Checker:
    def check(v, where):
        if not isinstance(v, dict):
            raise ProtocolError(400, f"{where}: expected map for {tp.__name__}")
        return _build(tp, v, where)
    return check


def _unsupported(tp: Any) -> Checker:
    def check(v, where):
        raise ProtocolError(400, f"{where}: unsupported type {_type_name(tp)}")
    return check


@cache
def _layout(cls: type) -> tuple[frozenset, tuple]:
    """cls's field names, and (name, checker, required) per field."""
    hints = typing.get_type_hints(cls)
    plan = tuple((f.name, _checker(hints[f.name]),
                  f.default is MISSING and f.default_factory is MISSING) for f in fields(cls))
    return frozenset(name for name, _, _ in plan), plan


def _build(cls: type, d: dict, where: str) -> Any:
    known, plan = _layout(cls)
    unknown = [k for k in d if k != "t" and k not in known]
    if unknown:
        raise ProtocolError(400, f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    kwargs = {}
    for name, check, required in plan:
        if name in d:
            kwargs[name] = check(d[name], f"{where}.{name}")
        elif required:
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


# A frame `decode` refused may still name its request, so that the error reply can.
def peek_request_id(frame: bytes) -> str | None:
    """The frame's top-level "request_id" string, or None; never raises.

    Walks the map with a streaming unpacker and skips other values unread into Python
    objects, so a 3 MB prompt costs a scan, not a list of a million ints.
    """
    if not frame:
        return None
    try:
        up = msgpack.Unpacker(raw=False, max_buffer_size=len(frame))
        up.feed(frame)
        for _ in range(up.read_map_header()):
            key = up.unpack()
            if key == "request_id":
                value = up.unpack()
                return value if isinstance(value, str) else None
            up.skip()
    except Exception:  # any malformation just means "unknown"
        return None
    return None
