"""A tool's parameters schema read as OpenAI's strict mode reads it (docs/structured.md,
"Tool calls"): an object that names its properties takes no others unless it says so, so
the arguments a constrained call writes close instead of running on with invented keys.

What changes, recursively through every subschema (`properties`, `items`, `prefixItems`,
`additionalProperties`, `patternProperties`, `anyOf`/`oneOf`, `$defs`/`definitions`):
- an object schema with `properties` and none of `additionalProperties`,
  `patternProperties` or `unevaluatedProperties` gets `additionalProperties: false`;
- with `all_required` (the function's `strict: true`) its every named property is required,
  as strict mode demands; otherwise `required` stays as the schema gives it;
- an integer (`"type": "integer"`) without `minimum`/`maximum` (or their exclusive forms)
  is held to JSON's safe integers, +-(2**53 - 1), so that its digits end (the trained model
  wrote `"minutes":1000...` to max_tokens without it);
- a string (`"type": "string"`) with none of `maxLength`, `pattern`, `format`, `enum` or
  `const` is at most `max_string` characters (MAX_STRING unless the caller fits it to a
  token budget, frontend/tool_grammar.py; it wrote a search query as "tallest-tallest-..."
  to max_tokens without it); a schema that gives its own `maxLength` gets what it says.
What does not: an object that names no properties (`{"type": "object"}`: any object is
what it says), and the branches of an `allOf` (closing one would refuse its siblings'
properties); their own subschemas are still read. The result accepts a subset of what the
schema accepts, so every call it lets through is valid under the schema as given.
"""
from __future__ import annotations

OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions")   # name -> schema
LIST_KEYS = ("anyOf", "oneOf", "prefixItems")                            # [schema]
ONE_KEYS = ("additionalProperties", "items", "not")                      # schema
SAFE_INTEGER = 2**53 - 1
MAX_STRING = 512
STRING_BOUNDS = ("maxLength", "pattern", "format", "enum", "const")


def strict_parameters(schema: dict, all_required: bool = False,
                      max_string: int = MAX_STRING) -> dict:
    """A copy of `schema` with its named-property objects closed (see the module)."""
    return _strict(schema, all_required, close=True, max_string=max_string)


def unbounded_strings(schema: dict) -> int:
    """How many string schemas in `schema` take the default bound (the ones a call's
    token budget is shared between)."""
    marked = strict_parameters(schema, max_string=_MARK)
    return _count_marks(marked)


_MARK = -1   # a bound no schema gives: marks the strings that took the default


def _count_marks(node) -> int:
    if isinstance(node, list):
        return sum(_count_marks(v) for v in node)
    if not isinstance(node, dict):
        return 0
    own = node.get("type") == "string" and node.get("maxLength") == _MARK
    return own + sum(_count_marks(v) for v in node.values())


def _strict(schema, all_required: bool, close: bool, max_string: int):
    if not isinstance(schema, dict):
        return schema   # `true`/`false` schemas and malformed parts: llguidance judges them
    out = dict(schema)

    def inner(v, closes: bool = True):
        return _strict(v, all_required, closes, max_string)

    for key in MAP_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {k: inner(v) for k, v in out[key].items()}
    for key in LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [inner(v) for v in out[key]]
    for key in ONE_KEYS:
        if key in out:
            items = out[key]
            out[key] = [inner(v) for v in items] if isinstance(items, list) else inner(items)
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [inner(v, False) for v in out["allOf"]]
    if out.get("type") == "string" and not any(k in out for k in STRING_BOUNDS):
        out["maxLength"] = max_string
    if out.get("type") == "integer":
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
    if isinstance(out.get("properties"), dict):
        if close and not any(k in out for k in OPEN_KEYS):
            out["additionalProperties"] = False
        if all_required:
            out["required"] = list(out["properties"])
    return out
