"""The grammar a `tool_choice` of `required` or a named function puts on a chat reply
(docs/structured.md, "Tool calls"): the output is exactly one call (or, with
parallel_tool_calls, one or more) of the offered functions, each `{"name", arguments}`
valid against that function's parameters schema, written in the model's own tool-call
format, so the parser of that format (frontend/tool_parsers.py) reads every call back.

The grammar is a Lark text with one llguidance `%json` rule per function (its schema's
`$defs` lifted to the rule's root so that its `#/$defs/...` references still resolve); it
travels as an ordinary `grammar` constraint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from frontend.tool_parsers import CLOSE, HERMES, LLAMA3, OPEN

# A function without parameters takes none: its arguments are {}.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_COMPACT = {"whitespace_flexible": False}   # as worker/grammar_text.py's JSON_OPTIONS


@dataclass(frozen=True)
class CallShape:
    """How a format writes its calls: around each one, between two, the arguments' key."""
    open: str
    close: str
    sep: str
    key: str


SHAPES = {HERMES: CallShape(OPEN + "\n", "\n" + CLOSE, "\n", "arguments"),
          LLAMA3: CallShape("", "", "; ", "parameters")}


def call_schema(name: str, parameters: dict | None, key: str = "arguments") -> dict:
    """The JSON schema of one call of `name`."""
    params = dict(NO_PARAMETERS if parameters is None else parameters)
    lifted = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    params.pop("$schema", None)
    return {"type": "object",
            "properties": {"name": {"const": name}, key: params},
            "required": ["name", key], "additionalProperties": False,
            **lifted, "x-guidance": _COMPACT}


def call_grammar(functions: list[dict], fmt: str, parallel: bool) -> str:
    """Lark text: calls of `functions` ([{"name", "parameters"?}], the ones allowed)."""
    shape = SHAPES[fmt]
    rules = [f"f{i}: %json {json.dumps(call_schema(f['name'], f.get('parameters'), shape.key))}"
             for i, f in enumerate(functions)]
    body = " | ".join(f"f{i}" for i in range(len(functions)))
    call = " ".join(x for x in (_lit(shape.open), f"({body})", _lit(shape.close)) if x)
    start = f"start: call ({_lit(shape.sep)} call)*" if parallel else "start: call"
    return "\n".join([start, f"call: {call}", *rules]) + "\n"


def _lit(s: str) -> str:
    return json.dumps(s) if s else ""
