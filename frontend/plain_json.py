"""A nested field checked to be plain JSON before anything walks it recursively.

msgpack frames can carry what JSON cannot (bytes, maps with non-string keys) and any
nesting; json.dumps, the key checks and the grammar compilers would raise TypeError or
RecursionError on them, deep in code that answers nothing. `check_plain` walks the value
without recursion and raises InvalidField (a 400 naming the field) instead.
"""
from __future__ import annotations

import math

from core.bounds import MAX_JSON_DEPTH
from frontend.validate import InvalidField

_SCALARS = (str, bool, int, type(None))


def check_plain(value, field: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """InvalidField naming `field` where `value` is not JSON (dict keys strings; values
    dicts, lists, strings, numbers, booleans or null) or nests deeper than `max_depth`."""
    why = plain_problem(value, max_depth)
    if why is not None:
        raise InvalidField(f"{field}{why}", field)


def plain_problem(value, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why `value` is not plain JSON within `max_depth` levels (a phrase that follows the
    field's name), or None."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f": {item} is not a JSON number"
            continue
        if not isinstance(item, (dict, list)):
            return f": a {type(item).__name__} value is not JSON"
        if depth > max_depth:
            return f" nests deeper than {max_depth} levels"
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                return ": an object key is not a string"
            item = item.values()
        stack.extend((v, depth + 1) for v in item)
    return None
