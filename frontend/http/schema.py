"""The gateway's request bodies: OpenAI's JSON in, one GenRequest (the Client's Generate and
how to answer it) out, or an ApiError.

Types are checked here (OpenAI's 400 for a wrong type), and value ranges with the
frontend's own checks (frontend/validate.py): the same bounds and messages, with
max_tokens up to the served max_model_len; what only the model knows (top_k against its
vocabulary, the prompt's tokens) the frontend checks, and its 400 passes through as it is.
The body's JSON itself is checked first (frontend/http/jsonbody.py).
Fields OpenAI defines that the engine cannot honour (logprobs, echo, best_of > 1, suffix,
tools, logit_bias, n > 1) get a 400 naming them; other unknown fields are ignored, as
OpenAI-compatible servers usually do.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from core.ipc.protocol import Generate
from frontend.client.common import make_generate
from frontend.limits import MAX_PRIORITY
from frontend.validate import InvalidRequest, check_fields

PRIORITY_HEADER = "X-TL-Priority"
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_INT = re.compile(r"[+-]?[0-9]{1,7}")

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    """An answer in OpenAI's error format: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.status}}


@dataclass
class GenRequest:
    """A parsed body: the engine's request as the Client builds it (make_generate, so the
    same Generate and the same request_id default) and how the gateway answers it."""
    msg: Generate
    stream: bool = False

    def client_kwargs(self) -> dict:
        """`msg` as the arguments of AsyncClient.stream (make_generate's parameters are
        Generate's fields)."""
        return asdict(self.msg)


def parse_priority(value: str | None) -> int:
    if value is None:
        return 0
    lo, hi = -MAX_PRIORITY, MAX_PRIORITY
    text = value.strip()
    if not _INT.fullmatch(text) or not lo <= int(text) <= hi:
        raise ApiError(400, f"{PRIORITY_HEADER} must be an integer in [{lo}, {hi}], "
                            f"got {value!r}", PRIORITY_HEADER)
    return int(text)


def parse_completion(body: dict, priority: int, max_model_len: int | None = None) -> GenRequest:
    gen = _common(body, _prompt(body.get("prompt")), priority,
                  _field(body, "max_tokens", _is_int, "an integer", COMPLETION_MAX_TOKENS))
    return _in_range(gen, max_model_len)


def parse_chat(body: dict, priority: int, render: Callable[[list], str],
               default_max_tokens: int, max_model_len: int | None = None) -> GenRequest:
    """`render` turns the checked messages into the prompt text (the chat template)."""
    max_tokens = _field(body, "max_completion_tokens", _is_int, "an integer", None)
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", _is_int, "an integer", default_max_tokens)
    gen = _common(body, render(_messages(body.get("messages"))), priority, max_tokens)
    return _in_range(gen, max_model_len)


def _in_range(gen: GenRequest, max_model_len: int | None) -> GenRequest:
    try:
        check_fields(gen.msg, max_model_len)
    except InvalidRequest as e:
        raise ApiError(400, str(e), e.field) from None
    return gen


# ------------------------------------------------------------------ fields


def _common(body: dict, prompt, priority: int, max_tokens: int) -> GenRequest:
    _refuse_unsupported(body)
    _field(body, "model", _is_str, "a string", None)
    n = _field(body, "n", _is_int, "an integer", 1)
    if n != 1:
        raise ApiError(400, f"only n=1 is supported, got {n}", "n")
    # every field given: OpenAI's defaults (temperature 1.0) are not the Client's
    msg = make_generate(
        prompt, max_tokens=max_tokens, priority=priority,
        temperature=float(_field(body, "temperature", _is_num, "a number", 1.0)),
        top_p=float(_field(body, "top_p", _is_num, "a number", 1.0)),
        top_k=_field(body, "top_k", _is_int, "an integer", 0),
        seed=_field(body, "seed", _is_int, "an integer", None),
        stop=_stop(body.get("stop")),
        ignore_eos=_field(body, "ignore_eos", _is_bool, "a boolean", False))
    return GenRequest(msg, stream=_field(body, "stream", _is_bool, "a boolean", False))


def _field(body: dict, name: str, ok: Callable[[Any], bool], what: str, default):
    value = body.get(name)
    if value is None:
        return default
    if not ok(value):
        raise ApiError(400, f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v) -> bool:
    return isinstance(v, str)


def _is_bool(v) -> bool:
    return isinstance(v, bool)


def _prompt(p) -> str | list[int]:
    """A string or a list of token ids; a batch of exactly one of either is unwrapped."""
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        return p
    raise ApiError(400, "prompt must be a string or a non-empty list of token ids "
                        "(batched prompts are not supported)", "prompt")


def _stop(s) -> list[str] | None:
    if s is None:
        return None
    if isinstance(s, str):
        return [s]
    if isinstance(s, list) and all(isinstance(x, str) for x in s):
        return s or None
    raise ApiError(400, "stop must be a string or a list of strings", "stop")


def _messages(msgs) -> list[dict]:
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
    if not isinstance(content, str):
        raise ApiError(400, "message content must be a string or a list of text parts",
                       "messages")
    return {"role": m["role"], "content": content}


_UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
                "best_of": (None, 1), "suffix": (None, ""), "tools": (None, []),
                "functions": (None, []), "logit_bias": (None, {})}


def _refuse_unsupported(body: dict) -> None:
    for name, neutral in _UNSUPPORTED.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in neutral):
            raise ApiError(400, f"{name} is not supported by this server", name)
