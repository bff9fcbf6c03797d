"""The grammar a `tool_choice` of `required` or a named function puts on a chat reply
(docs/structured.md, "Tool calls"): the output is exactly one call (or, with
parallel_tool_calls and `required`, one to MAX_PARALLEL_CALLS) of the offered functions,
each `{"name", arguments}` valid against that function's parameters schema read as strict
mode reads it (frontend/strict_schema.py), written in the model's own tool-call format, so
the parser of that format (frontend/tool_parsers.py) reads every call back.

Every sentence of the grammar is finite and it ends after the last call (Hermes: after an
optional newline), so a model that has written its calls can only write EOS: the reply
ends `stop`, which the gateway answers as `tool_calls`.

The grammar is a Lark text with one llguidance `%json` rule per function (its schema's
`$defs` lifted to the rule's root so that its `#/$defs/...` references still resolve); it
travels as an ordinary `grammar` constraint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from frontend.strict_schema import strict_parameters
from frontend.tool_parsers import CLOSE, HERMES, LLAMA3, OPEN

# A function without parameters takes none: its arguments are {}.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_COMPACT = {"whitespace_flexible": False}   # as worker/grammar_text.py's JSON_OPTIONS
# The most calls one reply holds with parallel_tool_calls: a bound, so that a model that
# keeps writing calls must stop after this many (OpenAI documents none).
MAX_PARALLEL_CALLS = 8


@dataclass(frozen=True)
class CallShape:
    """How a format writes its calls: around each one, between two, the arguments' key,
    and what may follow the last (a chat model ends its turn on a new line)."""
    open: str
    close: str
    sep: str
    key: str
    tail: str = ""


SHAPES = {HERMES: CallShape(OPEN + "\n", "\n" + CLOSE, "\n", "arguments", "\n"),
          LLAMA3: CallShape("", "", "; ", "parameters")}


def call_schema(name: str, parameters: dict | None, key: str = "arguments",
                strict: bool = False) -> dict:
    """The JSON schema of one call of `name`; `strict`: the function's `strict` (every
    named property required, frontend/strict_schema.py)."""
    params = strict_parameters(NO_PARAMETERS if parameters is None else parameters, strict)
    lifted = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    params.pop("$schema", None)
    return {"type": "object",
            "properties": {"name": {"const": name}, key: params},
            "required": ["name", key], "additionalProperties": False,
            **lifted, "x-guidance": _COMPACT}


def call_grammar(functions: list[dict], fmt: str, parallel: bool) -> str:
    """Lark text: calls of `functions` ([{"name", "parameters"?, "strict"?}], the ones
    allowed): one, or with `parallel` one to MAX_PARALLEL_CALLS."""
    shape = SHAPES[fmt]
    rules = [f"f{i}: %json " + json.dumps(call_schema(f["name"], f.get("parameters"),
                                                      shape.key, f.get("strict") is True))
             for i, f in enumerate(functions)]
    body = " | ".join(f"f{i}" for i in range(len(functions)))
    call = " ".join(x for x in (_lit(shape.open), f"({body})", _lit(shape.close)) if x)
    more = f" ({_lit(shape.sep)} call){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""
    tail = f" {_lit(shape.tail)}?" if shape.tail else ""
    return "\n".join([f"start: call{more}{tail}", f"call: {call}", *rules]) + "\n"


def _lit(s: str) -> str:
    return json.dumps(s) if s else ""
