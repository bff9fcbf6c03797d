"""Request bodies as JSON the rest of the gateway can trust: an object nested at most
MAX_DEPTH deep, whose strings are valid Unicode (no lone UTF-16 surrogates, which JSON's
\\uXXXX escapes can spell but UTF-8 and msgpack cannot carry), whose integers fit the
wire's 64 bits and whose numbers are finite. Anything else is a 400 that says where: its
param is the top-level field the bad value is in, or BODY when the body as a whole is at
fault (not JSON, not an object, nested too deep to parse).
"""
from __future__ import annotations

import json
import math
import re

from frontend.http.errors import ApiError

MAX_DEPTH = 32                   # OpenAI's bodies nest 5 deep (messages -> content parts)
INT_RANGE = (-2 ** 63, 2 ** 64)  # what msgpack can carry
BODY = "body"
_SURROGATE = re.compile("[\ud800-\udfff]")  # decoded pairs are one character: these are lone


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, f"the body is nested deeper than {MAX_DEPTH} levels",
                       BODY) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}", BODY) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", BODY)
    _check_values(body)
    return body


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_values(body: dict) -> None:
    """Walks the body without recursion; raises ApiError naming a bad value. A path is
    built only for a nested container or a refused value: a long list of token ids costs
    one check per id."""
    stack: list[tuple[dict | list, str, int]] = [(body, "", 1)]
    while stack:
        container, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            _refuse(path, f"the body is nested deeper than {MAX_DEPTH} levels")
        pairs = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in pairs:
            if isinstance(key, str) and _problem(key):
                _refuse(path, f"a key in {path[1:] or 'the body'} {_problem(key)}")
            if isinstance(value, (dict, list)):
                stack.append((value, _child(path, key), depth + 1))
            elif _problem(value):
                where = _child(path, key)
                _refuse(where, f"{where[1:]} {_problem(value)}")


def _problem(value) -> str | None:
    """What is wrong with a JSON scalar, or None."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return m and f"holds a lone UTF-16 surrogate (\\u{ord(m.group()):04x})"
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        lo, hi = INT_RANGE
        return None if lo <= value < hi else "is an integer out of range [-2**63, 2**64)"
    if isinstance(value, float) and not math.isfinite(value):
        return "is a number out of range"
    return None


def _child(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    shown = _SURROGATE.sub("?", key[:40]) + ("..." if len(key) > 40 else "")
    return f"{path}.{shown}"


def _refuse(path: str, message: str):
    """param: the top-level field the bad value is in (BODY: a top-level key is bad)."""
    top = re.match(r"\.([^.\[]*)", path)
    raise ApiError(400, message, top.group(1) if top else BODY)
