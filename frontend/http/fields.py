"""Typed reads of a request body's fields: a wrong type is OpenAI's 400 naming the field.

Value ranges are not checked here (frontend/validate.py does, through schema.py).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from frontend.http.errors import ApiError
from frontend.http.tool_messages import tool_fields


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_ids(v) -> bool:
    return isinstance(v, list) and all(map(_is_int, v))


Kind = tuple[str, Callable[[Any], bool]]
INT: Kind = ("an integer", _is_int)
NUM: Kind = ("a number", _is_num)
STR: Kind = ("a string", lambda v: isinstance(v, str))
BOOL: Kind = ("a boolean", lambda v: isinstance(v, bool))
IDS: Kind = ("a list of integer token ids", _is_ids)
OBJ: Kind = ("an object", lambda v: isinstance(v, dict))


def get(body: dict, name: str, kind: Kind, default=None):
    """body[name] when present and not null, else `default`."""
    value = body.get(name)
    if value is None:
        return default
    what, ok = kind
    if not ok(value):
        raise ApiError(400, f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def prompts(p) -> list[str | list[int]]:
    """OpenAI's and vLLM's prompt forms as a list of prompts: a string, a list of strings,
    a list of token ids or a list of token-id lists."""
    if isinstance(p, str) or (_is_ids(p) and p):
        return [p]
    if isinstance(p, list) and p and (all(isinstance(x, str) for x in p)
                                      or all(_is_ids(x) and x for x in p)):
        return p
    raise ApiError(400, "prompt must be a string, a list of strings, a non-empty list of "
                        "token ids or a list of non-empty token-id lists", "prompt")


def stop(s) -> list[str] | None:
    if s is None:
        return None
    if isinstance(s, str):
        return [s]
    if isinstance(s, list) and all(isinstance(x, str) for x in s):
        return s or None
    raise ApiError(400, "stop must be a string or a list of strings", "stop")


def messages(msgs) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    return [_message(m) for m in msgs]


def _message(m) -> dict:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, "each message must be an object with a string role", "messages")
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise ApiError(400, "only text content parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if content is None and m["role"] == "assistant" and m.get("tool_calls"):
        content = ""   # a message of calls only
    if not isinstance(content, str):
        raise ApiError(400, "message content must be a string or a list of text parts",
                       "messages")
    return {"role": m["role"], "content": content, **tool_fields(m)}
