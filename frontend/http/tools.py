"""A chat body's `tools`, `tool_choice` and `parallel_tool_calls`, checked into one ToolAsk
(docs/structured.md, "Tool calls"), and the constraint that `required` or a named function
puts on the reply. Every refusal is a 400 naming the field.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from core.ipc.protocol import Constraint
from frontend.compile_check import CompileCheck
from frontend.http.errors import ApiError
from frontend.structured import MAX_CONSTRAINT_CHARS
from frontend.tool_grammar import call_grammar, call_schema

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's function names
MAX_TOOLS = 128
CHOICES = ("none", "auto", "required")
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class ToolAsk:
    tools: tuple            # the body's tools, checked: {"type": "function", "function": {}}
    choice: str             # "none", "auto", "required" or "named"
    parallel: bool = True   # parallel_tool_calls
    name: str | None = None  # the function a named choice asks for

    @property
    def parses(self) -> bool:
        """The reply is read for calls (`none`: never)."""
        return self.choice != "none"

    @property
    def constrains(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def functions(self) -> list[dict]:
        """The functions a call may name."""
        fns = [t["function"] for t in self.tools]
        return [f for f in fns if f["name"] == self.name] if self.name else fns

    def structured_outputs(self, fmt: str, compiles: CompileCheck | None = None,
                           budget: int | None = None) -> dict | None:
        """The engine's constraint for a reply in `fmt` (frontend/tool_parsers.py FORMATS),
        fitted to `budget` tokens (its max_tokens), None where nothing is constrained."""
        if not self.constrains:
            return None
        # a named function is called once, parallel_tool_calls or not (as vLLM does)
        text = call_grammar(self.functions, fmt, self.parallel and self.name is None, budget)
        if len(text) > MAX_CONSTRAINT_CHARS:
            raise ApiError(400, f"tools: the calls' grammar is {len(text)} characters; at "
                                f"most {MAX_CONSTRAINT_CHARS}", "tools")
        _compiles(Constraint("grammar", text), "tools: the calls' grammar",
                  compiles or CompileCheck())
        return {"grammar": text}


def tool_ask(body: dict, compiles: CompileCheck | None = None) -> ToolAsk | None:
    """The body's tool fields checked, each function's parameters compiled by `compiles`
    (a fresh CompileCheck where not given); None when it offers no tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice is only allowed when tools are given",
                           "tool_choice")
        return None
    checked = _tools(tools, compiles or CompileCheck())
    kind, name = _choice(choice, {t["function"]["name"] for t in checked})
    return ToolAsk(checked, kind, parallel is not False, name)


def _tools(tools, compiles: CompileCheck) -> tuple:
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ApiError(400, f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    out, names = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if (not isinstance(t, dict) or t.get("type") != "function" or set(t) - {"type", "function"}
                or not isinstance(t.get("function"), dict)):
            raise ApiError(400, f"{where} must be {{\"type\": \"function\", \"function\": "
                                "{name, description, parameters}}", "tools")
        f = t["function"]
        _function(f, where, compiles)
        if f["name"] in names:
            raise ApiError(400, f"{where}: the name {f['name']!r} is offered twice", "tools")
        names.add(f["name"])
        out.append({"type": "function", "function": f})
    return tuple(out)


def _function(f: dict, where: str, compiles: CompileCheck) -> None:
    extra = sorted(set(f) - FUNCTION_KEYS)
    if extra:
        raise ApiError(400, f"{where}.function: unknown key {extra[0][:40]!r}", "tools")
    if not isinstance(f.get("name"), str) or not NAME.fullmatch(f["name"]):
        raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, _ or -",
                       "tools")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise ApiError(400, f"{where}.function.description must be a string", "tools")
    if f.get("strict") is not None and not isinstance(f["strict"], bool):
        raise ApiError(400, f"{where}.function.strict must be a boolean", "tools")
    params = f.get("parameters")
    if params is None:
        return
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ApiError(400, f"{where}.function.parameters must be a JSON schema of an "
                            "object", "tools")
    _compiles(Constraint("json", json.dumps(call_schema(f["name"], params,
                                                        strict=f.get("strict") is True))),
              f"{where}.function.parameters", compiles)


def _choice(choice, names: set) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str) and choice in CHOICES:
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    if (not isinstance(choice, dict) or choice.get("type") != "function"
            or not isinstance(fn, dict) or not isinstance(fn.get("name"), str)):
        raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": '
                            '"function", "function": {"name": ...}}', "tool_choice")
    if fn["name"] not in names:
        raise ApiError(400, f"tool_choice names {fn['name'][:64]!r}, which is not among "
                            "the tools", "tool_choice")
    return "named", fn["name"]


def _compiles(c: Constraint, where: str, compiles: CompileCheck) -> None:
    error = compiles.error(c)
    if error is not None:
        raise ApiError(400, f"{where}: {error[:300]}", "tools")
