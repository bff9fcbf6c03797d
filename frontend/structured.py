"""A request's structured-output fields as the one Constraint the engine takes
(docs/structured.md, "The fields"): OpenAI's `response_format` and vLLM's
`structured_outputs`, on HTTP bodies and as Client.generate keywords alike.

Every refusal is an InvalidField naming the field: a wrong shape, both fields at once, a
constraint over MAX_CONSTRAINT_CHARS, or one the grammar engine cannot compile within the
compile bound (frontend/compile_check.py).
"""
from __future__ import annotations

import json

from core.ipc.protocol import Constraint
from frontend.bounded_json import OBJECT_GRAMMAR
from frontend.plain_json import check_plain
from frontend.validate import InvalidField

# A constraint's text (a schema as compact JSON, a regex, the choices, a grammar) at most:
# it travels in the request, the batch that first samples it and the step log.
MAX_CONSTRAINT_CHARS = 65536
# json_object (and a json_schema without a schema): any JSON object within bounds, a
# grammar whose every sentence ends (frontend/bounded_json.py)
ANY_OBJECT = Constraint("grammar", OBJECT_GRAMMAR)
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")
FORMAT_TYPES = ("text", "json_object", "json_schema")


def constraint_of(response_format, structured_outputs) -> Constraint | None:
    """The constraint the two fields ask for (None: free text), unchecked by the engine."""
    for value, field in ((response_format, "response_format"),
                         (structured_outputs, "structured_outputs")):
        check_plain(value, field)
    if response_format is not None and structured_outputs is not None:
        if _format(response_format) is not None:
            raise InvalidField("give response_format or structured_outputs, not both",
                                 "structured_outputs")
    c = (_structured(structured_outputs) if structured_outputs is not None
         else _format(response_format) if response_format is not None else None)
    if c is not None and len(c.text) > MAX_CONSTRAINT_CHARS:
        field = "structured_outputs" if structured_outputs is not None else "response_format"
        raise InvalidField(f"{field}: the constraint is {len(c.text)} characters; at most "
                             f"{MAX_CONSTRAINT_CHARS}", field)
    return c


def check_constraint(req, compiles, budget=None) -> Constraint | None:
    """`req`'s constraint (a Generate, or anything with its two fields), compiled by
    `compiles` (a CompileCheck: bounded in time, its verdicts kept by key) so that what
    cannot compile, or not within the bound, is a 400 here. `budget(field)`, called before a
    constraint without a kept verdict is compiled, may refuse it (the frontend's per-client
    budget, frontend/constraint_budget.py: a 429)."""
    fmt, so = getattr(req, "response_format", None), getattr(req, "structured_outputs", None)
    c = constraint_of(fmt, so)
    if c is None:
        return None
    field = "structured_outputs" if so is not None else "response_format"
    if budget is not None and not compiles.cached(c):
        budget(field)
    error = compiles.error(c)
    if error is not None:
        raise InvalidField(f"{field}: {error}", field)
    return c


def _format(v) -> Constraint | None:
    where = "response_format"
    if not isinstance(v, dict) or v.get("type") not in FORMAT_TYPES:
        raise InvalidField(f"{where} must be an object whose type is one of "
                             f"{', '.join(FORMAT_TYPES)}", where)
    kind = v["type"]
    _only(v, {"type", kind} if kind == "json_schema" else {"type"}, where)
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    spec = v.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidField(f"{where}.json_schema must be an object with a name", where)
    _only(spec, {"name", "schema", "strict", "description"}, f"{where}.json_schema")
    schema = spec.get("schema")
    if schema is None:
        return ANY_OBJECT
    if not isinstance(schema, dict):
        raise InvalidField(f"{where}.json_schema.schema must be an object", where)
    return Constraint("json", json.dumps(schema, separators=(",", ":")))


def _structured(v) -> Constraint:
    where = "structured_outputs"
    given = [k for k in STRUCTURED_KINDS if isinstance(v, dict) and v.get(k) is not None]
    if not isinstance(v, dict) or len(given) != 1:
        raise InvalidField(f"{where} must be an object with exactly one of "
                             f"{', '.join(STRUCTURED_KINDS)}", where)
    _only({k: x for k, x in v.items() if x is not None}, set(given), where)
    kind = given[0]
    value = v[kind]
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidField(f"{where}.json is not JSON", where) from None
        if not isinstance(value, dict):
            raise InvalidField(f"{where}.json must be a JSON schema (an object)", where)
        return Constraint("json", json.dumps(value, separators=(",", ":")))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(
                isinstance(x, str) and x for x in value):
            raise InvalidField(f"{where}.choice must be a non-empty list of non-empty "
                                 "strings", where)
        return Constraint("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise InvalidField(f"{where}.{kind} must be a non-empty string", where)
    return Constraint(kind, value)


def _only(d: dict, keys: set, where: str) -> None:
    extra = sorted(set(d) - keys)
    if extra:
        field = where.split(".")[0]
        raise InvalidField(f"{where}: unknown key {extra[0][:40]!r}", field)
