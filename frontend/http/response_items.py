"""A /v1/responses body read into a chat body, so that one generation path (schema.py's
parse_chat, tools.py, the chat template) serves both APIs (docs/http.md, "/v1/responses").

`input` (a string or a list of items: messages, `function_call`, `function_call_output`)
becomes chat `messages`, `instructions` a first system message, the Responses shape of a
function tool (`{"type": "function", "name", "parameters"}`) chat's, `text.format` chat's
`response_format`, `max_output_tokens` `max_tokens`. Every refusal is a 400 naming the
Responses field; an item or part of an unknown type, or an unknown key in one, is refused
rather than dropped. The items this API returns (a message of `output_text`, a
`function_call`) are valid input, so a client can send a reply's `output` back.
"""
from __future__ import annotations

import json

from frontend.http.errors import ApiError

# Responses fields and the chat field each becomes (same name where not listed)
RESPONSES = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
    "tool_choice", "parallel_tool_calls", "text", "stream", "store", "previous_response_id",
    "user", "seed", "top_k", "priority", "metadata", "truncation", "reasoning", "include",
    "background", "service_tier", "prompt_cache_key", "safety_identifier", "max_tool_calls",
    "top_logprobs", "stream_options", "cache_salt"})
PASSED = ("model", "stream", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k",
          "priority", "prompt_cache_key", "safety_identifier", "cache_salt")
# accepted only at a value that asks for nothing (as allowed.py's NEUTRAL)
NEUTRAL = {"metadata": ({},), "truncation": ("disabled",), "reasoning": (),
           "include": ([],), "background": (False,), "service_tier": ("auto", "default"),
           "max_tool_calls": (), "top_logprobs": (0,), "stream_options": ()}
# a chat field's 400, said as the Responses field it came from
RESPONSES_PARAM = {"messages": "input", "max_tokens": "max_output_tokens",
                   "max_completion_tokens": "max_output_tokens",
                   "response_format": "text.format", "prompt": "input"}

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
ITEM_KEYS = {"message": {"type", "role", "content", "id", "status", "phase"},
             "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
             "function_call_output": {"type", "call_id", "output", "id", "status"}}
PART_KEYS = {"type", "text", "annotations", "logprobs"}
TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}


def chat_body(body: dict, earlier: list | None = None) -> dict:
    """The chat body that asks what `body` asks; `earlier`: the items of the response
    previous_response_id names (its input and output), ahead of this input."""
    check_fields(body)
    items = (earlier or []) + input_items(body.get("input"))
    out = {k: body[k] for k in PASSED if body.get(k) is not None}
    out["messages"] = _instructions(body.get("instructions")) + messages(items)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        out["tools"] = chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = chat_tool_choice(body["tool_choice"])
    fmt = response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    return out


def check_fields(body: dict) -> None:
    """The body's top-level fields known, neutral where only that is supported, typed."""
    for name in body:
        if name not in RESPONSES:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", name)
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is not None and not any(value == v and type(value) is type(v)
                                         for v in neutral):
            shown = " or ".join(["null"] + [json.dumps(v) for v in neutral])
            raise ApiError(400, f"{name} is not supported by this server: it is accepted "
                                f"only as {shown}, got {json.dumps(value)[:80]}", name)
    for name in ("store", "stream"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise ApiError(400, f"{name} must be a boolean", name)
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise ApiError(400, "previous_response_id must be a string", "previous_response_id")


def input_items(value) -> list[dict]:
    """`input` as a list of checked items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items", "input")
    return [checked_item(item, f"input[{i}]") for i, item in enumerate(value)]


def checked_item(item, where: str) -> dict:
    """One input item checked, in the plain form messages() reads."""
    if not isinstance(item, dict):
        raise ApiError(400, f"{where} must be an object", "input")
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ITEM_KEYS:
        raise ApiError(400, f"{where}: item type {str(kind)[:40]!r} is not supported (only "
                            f"{', '.join(ITEM_KEYS)})", "input")
    extra = sorted(set(item) - ITEM_KEYS[kind])
    if extra:
        raise ApiError(400, f"{where}: unknown key {extra[0][:40]!r} in a {kind} item",
                       "input")
    if kind == "message":
        return _message(item, where)
    return _call_item(item, kind, where)


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}", "input")
    return {"type": "message", "role": role, "content": _text(item.get("content"), where)}


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts",
                       "input")
    texts = []
    for j, part in enumerate(content):
        if (not isinstance(part, dict) or part.get("type") not in TEXT_PARTS
                or not isinstance(part.get("text"), str)):
            raise ApiError(400, f"{where}.content[{j}]: only input_text and output_text "
                                "parts are supported", "input")
        extra = sorted(set(part) - PART_KEYS)
        if extra:
            raise ApiError(400, f"{where}.content[{j}]: unknown key {extra[0][:40]!r}",
                           "input")
        texts.append(part["text"])
    return "".join(texts)


def _call_item(item: dict, kind: str, where: str) -> dict:
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise ApiError(400, f"{where}.call_id must be a non-empty string", "input")
    if kind == "function_call_output":
        return {"type": kind, "call_id": item["call_id"],
                "output": _text(item.get("output"), where + ".output")}
    if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
        raise ApiError(400, f"{where}: a function_call needs a string name and arguments",
                       "input")
    return {"type": kind, "call_id": item["call_id"], "name": item["name"],
            "arguments": item["arguments"]}


def messages(items: list[dict]) -> list[dict]:
    """Checked items as chat messages: a run of function_call items is one assistant
    message's tool_calls, a function_call_output a tool message."""
    out: list[dict] = []
    for item in items:
        if item["type"] == "message":
            out.append({"role": item["role"], "content": item["content"]})
        elif item["type"] == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": item["output"]})
        else:
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not (out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]):
                out.append({"role": "assistant", "content": "", "tool_calls": []})
            out[-1]["tool_calls"].append(call)
    return out


def _instructions(value) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise ApiError(400, "instructions must be a string", "instructions")
    return [{"role": "system", "content": value}]


def chat_tools(tools) -> list:
    """Responses' function tools in chat's shape (tools.py checks the rest)."""
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise ApiError(400, f"tools[{i}]: only function tools are supported "
                                '({"type": "function", "name", "parameters"})', "tools")
        extra = sorted(set(t) - TOOL_KEYS)
        if extra:
            raise ApiError(400, f"tools[{i}]: unknown key {extra[0][:40]!r}", "tools")
        out.append({"type": "function",
                    "function": {k: v for k, v in t.items() if k != "type" and v is not None}})
    return out


def chat_tool_choice(choice):
    """"none"/"auto"/"required" as they are; {"type": "function", "name"} as chat's."""
    if isinstance(choice, str):
        return choice
    if (isinstance(choice, dict) and choice.get("type") == "function" and set(choice)
            == {"type", "name"} and isinstance(choice["name"], str)):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, 'tool_choice must be "none", "auto", "required" or '
                        '{"type": "function", "name": ...}', "tool_choice")


def response_format(text) -> dict | None:
    """`text.format` as chat's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise ApiError(400, "text must be an object with a format", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError(400, 'text.verbosity is accepted only as null or "medium"', "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text" and set(fmt) == {"type"}:
        return None
    if kind == "json_object" and set(fmt) == {"type"}:
        return {"type": "json_object"}
    if kind == "json_schema" and not set(fmt) - {"type", "name", "schema", "strict",
                                                  "description"}:
        return {"type": "json_schema",
                "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    raise ApiError(400, 'text.format must be {"type": "text"}, {"type": "json_object"} or '
                        '{"type": "json_schema", "name", "schema", "strict"}', "text.format")


def responses_param(param: str | None) -> str | None:
    """A chat field's name in a 400, said as the Responses field."""
    return RESPONSES_PARAM.get(param, param)
