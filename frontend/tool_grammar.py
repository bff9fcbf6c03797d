"""The grammar a `tool_choice` of `required` or a named function puts on a chat reply
(docs/structured.md, "Tool calls"): the output is exactly one call (or, with
parallel_tool_calls and `required`, one to MAX_PARALLEL_CALLS) of the offered functions,
each `{"name", arguments}` valid against that function's parameters schema read as strict
mode reads it (frontend/strict_schema.py), written in the model's own tool-call format, so
the parser of that format (frontend/tool_parsers.py) reads every call back.

Every sentence of the grammar is finite and it ends after the last call (Hermes: after an
optional newline), so a model that has written its calls can only write EOS: the reply
ends `stop`, which the gateway answers as `tool_calls`.

Fitted to the reply's token budget (its max_tokens): a model that loops inside what the
grammar allows (the trained 135M model wrote a 512-character string and then the same
call again, to max_tokens) must still close its last call in time. Every token writes at
least one character, so the calls allowed and each unbounded string's length are chosen
so that the calls' characters fit the budget: at most one call per CALL_TOKENS of budget
(up to MAX_PARALLEL_CALLS), and a call's share of the budget, less its keys and
punctuation, split between its unbounded strings (MIN_STRING to MAX_STRING characters
each). An escape (`\n`, `\u00e9`) writes one character in several, and numbers have no
digit bound, so this is a fit, not a proof; a schema's own `maxLength` is kept. The budget
is first rounded down to a step of budget_step's (two a doubling: 512, 768, 1024, 1536, ...):
requests whose max_tokens differ a little share one grammar, so they compile it once and
count once against the client's budget of new constraints, and a smaller budget still fits.

The grammar is a Lark text with one llguidance `%json` rule per function (its schema's
`$defs` lifted to the rule's root so that its `#/$defs/...` references still resolve); it
travels as an ordinary `grammar` constraint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from frontend.strict_schema import MAX_STRING, strict_parameters, unbounded_strings
from frontend.tool_parsers import CLOSE, HERMES, LLAMA3, OPEN

# A function without parameters takes none: its arguments are {}.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_COMPACT = {"whitespace_flexible": False}   # as worker/grammar_text.py's JSON_OPTIONS
# The most calls one reply holds with parallel_tool_calls: a bound, so that a model that
# keeps writing calls must stop after this many (OpenAI documents none).
MAX_PARALLEL_CALLS = 8
CALL_TOKENS = 512       # the budget each parallel call needs
MIN_STRING = 32         # the shortest bound a budget gives an unbounded string
CALL_FRAME = 64         # a call's characters outside its arguments' names and values


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
                strict: bool = False, max_string: int = MAX_STRING) -> dict:
    """The JSON schema of one call of `name`; `strict`: the function's `strict` (every
    named property required, frontend/strict_schema.py)."""
    params = strict_parameters(NO_PARAMETERS if parameters is None else parameters, strict,
                               max_string)
    lifted = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    params.pop("$schema", None)
    return {"type": "object",
            "properties": {"name": {"const": name}, key: params},
            "required": ["name", key], "additionalProperties": False,
            **lifted, "x-guidance": _COMPACT}


def budget_step(budget: int | None) -> int | None:
    """`budget` rounded down to 2^k or 3 x 2^(k-1), the steps the grammar is fitted to."""
    if budget is None or budget < 2:
        return budget
    power = 1 << (budget.bit_length() - 1)
    return power + power // 2 if budget >= power + power // 2 else power


def most_calls(parallel: bool, budget: int | None) -> int:
    """The calls a reply may hold: one, or with `parallel` one per CALL_TOKENS of the
    budget, MAX_PARALLEL_CALLS at most (all of them where no budget is given)."""
    if not parallel:
        return 1
    return MAX_PARALLEL_CALLS if budget is None else max(1, min(MAX_PARALLEL_CALLS,
                                                               budget // CALL_TOKENS))


def string_bound(function: dict, calls: int, budget: int | None) -> int:
    """The characters each of `function`'s unbounded strings may take when `calls` calls
    share `budget` tokens (MAX_STRING where no budget is given)."""
    params = function.get("parameters")
    strings = unbounded_strings(NO_PARAMETERS if params is None else params)
    if budget is None or strings == 0:
        return MAX_STRING
    frame = CALL_FRAME + len(function["name"]) + _names_length(params)
    share = (budget // calls - frame) // strings
    return max(MIN_STRING, min(MAX_STRING, share))


def call_grammar(functions: list[dict], fmt: str, parallel: bool,
                 budget: int | None = None) -> str:
    """Lark text: calls of `functions` ([{"name", "parameters"?, "strict"?}], the ones
    allowed): one, or with `parallel` up to most_calls, fitted to `budget` tokens (the
    reply's max_tokens, taken at its budget_step; None: the fixed bounds alone)."""
    budget = budget_step(budget)
    shape, calls = SHAPES[fmt], most_calls(parallel, budget)
    rules = [f"f{i}: %json " + json.dumps(call_schema(
        f["name"], f.get("parameters"), shape.key, f.get("strict") is True,
        string_bound(f, calls, budget))) for i, f in enumerate(functions)]
    body = " | ".join(f"f{i}" for i in range(len(functions)))
    call = " ".join(x for x in (_lit(shape.open), f"({body})", _lit(shape.close)) if x)
    more = f" ({_lit(shape.sep)} call){{0,{calls - 1}}}" if calls > 1 else ""
    tail = f" {_lit(shape.tail)}?" if shape.tail else ""
    return "\n".join([f"start: call{more}{tail}", f"call: {call}", *rules]) + "\n"


def _names_length(schema) -> int:
    """The characters of every property name in `schema`, quotes and colon included."""
    if isinstance(schema, list):
        return sum(_names_length(v) for v in schema)
    if not isinstance(schema, dict):
        return 0
    props = schema.get("properties")
    own = sum(len(k) + 4 for k in props) if isinstance(props, dict) else 0
    return own + sum(_names_length(v) for v in schema.values())


def _lit(s: str) -> str:
    return json.dumps(s) if s else ""
