"""Tool calls and results in chat messages, for the chat template (docs/structured.md,
"Tool calls").

An assistant message's `tool_calls` reach the template in Hugging Face's shape (each call's
`arguments` a dict: templates write it with `tojson`), a `tool` message keeps its
`tool_call_id`. A template that knows tools (it reads `tools`) gets them as they are; for
one that does not (ChatML, SmolLM2's) the conversation is written out in the Hermes format
first: the tools in the system message, calls as `<tool_call>` blocks, results as
`<tool_response>` blocks in a user message, so the model sees them and answers in the
format the Hermes parser reads.
"""
from __future__ import annotations

import json

from frontend.http.errors import ApiError
from frontend.tool_parsers import CLOSE, HERMES, LLAMA3, OPEN

HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>")


def tool_fields(m: dict) -> dict:
    """A message's tool keys, checked: an assistant's `tool_calls`, a tool's
    `tool_call_id`."""
    out = {}
    if m.get("tool_calls") is not None:
        if m["role"] != "assistant" or not isinstance(m["tool_calls"], list):
            raise ApiError(400, "tool_calls must be a list, on an assistant message",
                           "messages")
        out["tool_calls"] = [_call(c) for c in m["tool_calls"]]
    if m.get("tool_call_id") is not None:
        if not isinstance(m["tool_call_id"], str):
            raise ApiError(400, "tool_call_id must be a string", "messages")
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _call(c) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, "each tool call must be {id, type: \"function\", function: "
                            "{name, arguments}}", "messages")
    args = fn.get("arguments", "{}")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise ApiError(400, "a tool call's arguments must be a JSON object (as a string)",
                       "messages")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(c.get("id"), str):
        out["id"] = c["id"]
    return out


def knows_tools(template: str) -> bool:
    return "tools" in template


def tool_format(template: str) -> str:
    """The format the template's model writes calls in (tool_parsers.FORMATS)."""
    llama = "<|python_tag|>" in template or "<|start_header_id|>" in template
    return LLAMA3 if llama and knows_tools(template) else HERMES


def has_tool_parts(messages: list[dict]) -> bool:
    return any("tool_calls" in m or m["role"] == "tool" for m in messages)


def hermes_messages(messages: list[dict], tools: list | None) -> list[dict]:
    """The conversation in plain messages, written in the Hermes format."""
    out = [_hermes(m) for m in messages]
    if tools:
        system = HERMES_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _hermes(m: dict) -> dict:
    if m["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
    calls = [f"{OPEN}\n{json.dumps(c['function'])}\n{CLOSE}" for c in m.get("tool_calls", ())]
    return {"role": m["role"], "content": "\n".join(([m["content"]] if m["content"] else [])
                                                    + calls)}
