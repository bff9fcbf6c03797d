"""Varied JSON schemas for the structured-output benchmark, the engine comparison and the
tests: `schemas(n)` gives n distinct ones, mixing objects, arrays, enums, nesting, bounded
strings and numbers, optional properties, patterns and anyOf."""
from __future__ import annotations

import json

_BASE = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "population": {"type": "integer", "minimum": 0}},
     "required": ["city", "population"]},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                                      "confidence": {"type": "number"}},
     "required": ["answer", "confidence"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                "minItems": 1, "maxItems": 3}},
     "required": ["items"]},
    {"type": "object", "properties": {
        "title": {"type": "string"},
        "author": {"type": "object", "properties": {"first": {"type": "string"},
                                                    "last": {"type": "string"}},
                   "required": ["first", "last"]},
        "year": {"type": "integer"}},
     "required": ["title", "author", "year"]},
    {"type": "object", "properties": {"valid": {"type": "boolean"},
                                      "reason": {"type": "string", "maxLength": 40}},
     "required": ["valid"]},
    {"type": "object", "properties": {"date": {"type": "string",
                                               "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                                      "event": {"type": "string"}},
     "required": ["date", "event"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"},
                                                          {"type": "string"}]},
                                      "unit": {"type": "string", "enum": ["m", "kg", "s"]}},
     "required": ["value", "unit"]},
    {"type": "object", "properties": {"steps": {"type": "array", "maxItems": 4, "items": {
        "type": "object", "properties": {"n": {"type": "integer"},
                                         "text": {"type": "string", "maxLength": 30}},
        "required": ["n", "text"]}}},
     "required": ["steps"]},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"},
                                      "label": {"type": ["string", "null"]}},
     "required": ["x", "y", "label"]},
]
_FIELDS = ["color", "size", "score", "tag", "note", "count", "kind", "level"]
_TYPES = [{"type": "string", "maxLength": 16}, {"type": "integer"}, {"type": "boolean"},
          {"type": "string", "enum": ["low", "mid", "high"]}, {"type": "number"},
          {"type": "array", "items": {"type": "integer"}, "maxItems": 3}]


def schemas(n: int) -> list[dict]:
    """n distinct schemas: the ten above, then each with one extra required property (a
    name and type that vary with i), so that no two compile to the same grammar."""
    out = []
    for i in range(n):
        s = json.loads(json.dumps(_BASE[i % len(_BASE)]))
        if i >= len(_BASE):
            extra = f"{_FIELDS[i % len(_FIELDS)]}_{i}"
            s["properties"][extra] = _TYPES[(i // len(_BASE)) % len(_TYPES)]
            s["required"] = [*s.get("required", []), extra]
        s["additionalProperties"] = False
        out.append(s)
    return out
