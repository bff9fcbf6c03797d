"""Constrained replies that finish (docs/structured.md, "Tool calls"): a tool's schema read
as strict mode reads it (frontend/strict_schema.py), so constrained arguments close;
`required` and a named function allow exactly as many calls as the request does, and the
grammar then admits only EOS; `json_object` is a bounded grammar (frontend/bounded_json.py)
that ends when the object closes (pure: llguidance over a byte vocabulary, no engine)."""
from __future__ import annotations

import json

import llguidance
import pytest

from frontend import bounded_json as bj
from frontend.http.tools import tool_ask
from frontend.strict_schema import MAX_STRING, strict_parameters
from frontend.structured import constraint_of
from frontend.tool_grammar import (CALL_TOKENS, MAX_PARALLEL_CALLS, MIN_STRING, budget_step,
                                   most_calls, string_bound)
from frontend.tool_parsers import HERMES, LLAMA3
from worker.grammar_text import byte_tokenizer, grammar_of

EOS = 256   # byte_tokenizer()'s
OPEN_WEATHER = {"type": "object", "properties": {          # no additionalProperties
    "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]}


def fn(name: str, **kw) -> dict:
    return {"type": "function", "function": {"name": name, **kw}}


def matcher(body: dict, fmt: str = HERMES, budget: int | None = None):
    grammar = tool_ask(body).structured_outputs(fmt, budget=budget)["grammar"]
    m = llguidance.LLMatcher(byte_tokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar),
                             log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def take(m, text: str) -> bool:
    data = list(text.encode())
    return m.try_consume_tokens(data) == len(data) and not m.is_error()


def only_eos_next(m) -> bool:
    """After what `m` consumed, EOS is the one token allowed."""
    mask = m.compute_logit_bias()
    return [i for i, b in enumerate(mask) if b] == [EOS]


def hermes(n: int, call: dict) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(call, separators=(',', ':'))}\n</tool_call>"
                     for _ in range(n))


PARIS = {"name": "weather", "arguments": {"city": "Paris"}}
WEATHER = fn("weather", parameters=OPEN_WEATHER)


# ------------------------------------------------------------------ the schema


def test_named_property_objects_close_at_every_depth():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "b": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}},
        "c": {"anyOf": [{"type": "object", "properties": {"z": {}}}, {"type": "null"}]},
        "d": {"$ref": "#/$defs/D"}},
        "$defs": {"D": {"type": "object", "properties": {"w": {}}}}}
    given = json.dumps(schema)
    s = strict_parameters(schema)
    assert json.dumps(schema) == given   # the given schema is not changed
    assert s["additionalProperties"] is False
    assert s["properties"]["a"]["additionalProperties"] is False
    assert s["properties"]["b"]["items"]["additionalProperties"] is False
    assert s["properties"]["c"]["anyOf"][0]["additionalProperties"] is False
    assert s["$defs"]["D"]["additionalProperties"] is False
    assert "required" not in s   # required as given (none) without strict


def test_what_the_schema_allows_stays_allowed():
    free = {"type": "object"}
    assert strict_parameters(free) == free   # names no properties: any object
    opened = {"type": "object", "properties": {"a": {}},
              "additionalProperties": {"type": "string", "maxLength": 3}}
    assert strict_parameters(opened) == opened
    patterned = {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}}
    assert "additionalProperties" not in strict_parameters(patterned)
    # allOf's branches are not closed (each would refuse the other's properties)
    both = {"allOf": [{"type": "object", "properties": {"a": {}}},
                      {"type": "object", "properties": {"b": {}}}]}
    assert all("additionalProperties" not in b for b in strict_parameters(both)["allOf"])


def test_an_unbounded_integer_is_held_to_the_safe_integers():
    s = strict_parameters({"type": "object", "properties": {
        "n": {"type": "integer"}, "k": {"type": "integer", "minimum": 1},
        "x": {"type": "integer", "exclusiveMaximum": 10}}})["properties"]
    big = 2**53 - 1
    assert (s["n"]["minimum"], s["n"]["maximum"]) == (-big, big)
    assert (s["k"]["minimum"], s["k"]["maximum"]) == (1, big)
    assert s["x"]["minimum"] == -big and "maximum" not in s["x"]
    timer = fn("timer", parameters={"type": "object", "properties": {
        "minutes": {"type": "integer"}}, "required": ["minutes"]})
    m = matcher({"tools": [timer], "tool_choice": "required"})
    assert take(m, '<tool_call>\n{"name":"timer","arguments":{"minutes":' + str(big))
    assert not take(m, "0")   # a 17th digit


def test_an_unbounded_string_is_held_to_max_string_characters():
    s = strict_parameters({"type": "object", "properties": {
        "q": {"type": "string"}, "long": {"type": "string", "maxLength": 5000},
        "day": {"type": "string", "pattern": "^[0-9]{4}$"}, "u": {"enum": ["a", "b"]}}})
    p = s["properties"]
    assert p["q"]["maxLength"] == MAX_STRING and p["long"]["maxLength"] == 5000
    assert "maxLength" not in p["day"] and "maxLength" not in p["u"]
    search = fn("search", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    m = matcher({"tools": [search], "tool_choice": "required"})
    assert take(m, '<tool_call>\n{"name":"search","arguments":{"q":"' + "ab" * (MAX_STRING // 2))
    assert not take(m, "a") and take(m, '"}')   # the string must close


def test_strict_true_requires_every_named_property():
    s = strict_parameters(OPEN_WEATHER, all_required=True)
    assert s["required"] == ["city", "unit"]
    body = {"tools": [fn("weather", parameters=OPEN_WEATHER, strict=True)],
            "tool_choice": "required", "parallel_tool_calls": False}
    assert not take(matcher(body), hermes(1, PARIS))   # "unit" missing
    full = {"name": "weather", "arguments": {"city": "Paris", "unit": "C"}}
    assert take(matcher(body), hermes(1, full))


def test_an_unnamed_property_is_refused_where_the_schema_does_not_allow_it():
    body = {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                "function": {"name": "weather"}}}
    m = matcher(body)
    assert not take(m, '<tool_call>\n{"name":"weather","arguments":{"city":"Paris","type"')
    m = matcher(body)
    # after the last named property only the object's end may come
    assert take(m, '<tool_call>\n{"name":"weather","arguments":{"city":"Paris","unit":"C"')
    mask = m.compute_logit_bias()
    assert [chr(i) for i, b in enumerate(mask) if b] == ["}"]


# ------------------------------------------------------------------ how many calls


@pytest.mark.parametrize("body", [
    {"tool_choice": "required", "parallel_tool_calls": False},
    {"tool_choice": {"type": "function", "function": {"name": "weather"}}},
    {"tool_choice": {"type": "function", "function": {"name": "weather"}},
     "parallel_tool_calls": True},
], ids=["required-one", "named", "named-parallel"])
def test_one_call_and_then_only_eos(body):
    m = matcher({"tools": [WEATHER], **body})
    assert take(m, hermes(1, PARIS)) and only_eos_next(m) is False   # a newline may end it
    assert take(m, "\n") and only_eos_next(m)
    assert not take(matcher({"tools": [WEATHER], **body}), hermes(2, PARIS))


def test_parallel_calls_are_bounded_and_then_only_eos():
    body = {"tools": [WEATHER], "tool_choice": "required"}   # parallel_tool_calls defaults on
    for n in (1, 2, MAX_PARALLEL_CALLS):
        m = matcher(body)
        assert take(m, hermes(n, PARIS)), n
        assert m.is_accepting()
    m = matcher(body)
    assert take(m, hermes(MAX_PARALLEL_CALLS, PARIS) + "\n") and only_eos_next(m)
    assert not take(matcher(body), hermes(MAX_PARALLEL_CALLS + 1, PARIS))


def test_llama3_calls_are_bounded_and_end_on_the_object():
    body = {"tools": [WEATHER], "tool_choice": "required"}
    call = json.dumps({"name": "weather", "parameters": {"city": "Paris"}},
                      separators=(",", ":"))
    m = matcher(body, LLAMA3)
    assert take(m, "; ".join([call] * MAX_PARALLEL_CALLS)) and only_eos_next(m)
    one = matcher({**body, "parallel_tool_calls": False}, LLAMA3)
    assert take(one, call) and only_eos_next(one)


# ------------------------------------------------------------------ fitted to max_tokens

EMAIL = fn("send_email", parameters={"type": "object", "properties": {
    "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "subject", "body"]})


def longest_email(bound: int) -> dict:
    return {"name": "send_email",
            "arguments": {"to": "t" * bound, "subject": "s" * bound, "body": "b" * bound}}


def test_the_calls_allowed_follow_the_budget():
    assert most_calls(False, 10_000) == 1 and most_calls(True, None) == MAX_PARALLEL_CALLS
    assert most_calls(True, CALL_TOKENS - 1) == 1 and most_calls(True, 2 * CALL_TOKENS) == 2
    assert most_calls(True, 100 * CALL_TOKENS) == MAX_PARALLEL_CALLS
    body = {"tools": [WEATHER], "tool_choice": "required"}
    m = matcher(body, budget=2 * CALL_TOKENS)
    assert take(m, hermes(2, PARIS) + "\n") and only_eos_next(m)
    assert not take(matcher(body, budget=2 * CALL_TOKENS), hermes(3, PARIS))


@pytest.mark.parametrize("budget", [512, 1024, 3000])
def test_the_longest_reply_a_budget_allows_fits_it_in_characters(budget):
    """Every token writes at least one character, so a reply of the grammar's longest
    calls (every unbounded string at its bound) still fits max_tokens tokens; the grammar
    is fitted to the budget's step (3000 -> 2048)."""
    body = {"tools": [EMAIL], "tool_choice": "required"}
    calls = most_calls(True, budget_step(budget))
    bound = string_bound(EMAIL["function"], calls, budget_step(budget))
    assert MIN_STRING < bound < MAX_STRING
    longest = hermes(calls, longest_email(bound)) + "\n"
    assert len(longest) <= budget
    m = matcher(body, budget=budget)
    assert take(m, longest) and only_eos_next(m)
    m = matcher(body, budget=budget)   # a string one character longer must close instead
    assert take(m, '<tool_call>\n{"name":"send_email","arguments":{"to":"' + "t" * bound)
    assert not take(m, "t") and take(m, '"')


def test_budgets_a_little_apart_share_one_grammar():
    """max_tokens is rounded down to 2^k or 3 x 2^(k-1) before the fit, so that a client
    varying it a little compiles one constraint, not one per value."""
    assert [budget_step(b) for b in (None, 1, 2, 3, 511, 512, 767, 768, 1023, 1024, 3000)] == [
        None, 1, 2, 3, 384, 512, 512, 768, 768, 1024, 2048]
    body = {"tools": [EMAIL], "tool_choice": "required", "parallel_tool_calls": True}
    grammar = lambda b: tool_ask(body).structured_outputs(HERMES, budget=b)["grammar"]  # noqa: E731
    assert grammar(1000) == grammar(800) == grammar(768) != grammar(767) == grammar(512)


def test_no_budget_and_a_large_one_keep_the_fixed_bounds():
    assert string_bound(EMAIL["function"], MAX_PARALLEL_CALLS, None) == MAX_STRING
    assert string_bound(EMAIL["function"], MAX_PARALLEL_CALLS, 10**6) == MAX_STRING
    assert string_bound(EMAIL["function"], 1, 10) == MIN_STRING   # never below the floor
    own = fn("f", parameters={"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 900}}})
    m = matcher({"tools": [own], "tool_choice": "required"}, budget=CALL_TOKENS)
    assert take(m, '<tool_call>\n{"name":"f","arguments":{"s":"' + "x" * 900 + '"}}')


# ------------------------------------------------------------------ json_object


def json_object_matcher():
    c = constraint_of({"type": "json_object"}, None)
    assert c == constraint_of({"type": "json_schema", "json_schema": {"name": "any"}}, None)
    return llguidance.LLMatcher(byte_tokenizer(), grammar_of(c), log_level=0)


@pytest.mark.parametrize("text", [
    "{}", '{"a":[1,2],"b":{"c":null},"d":"x\\n\\u00e9\\/","e":-0.25e-3,"f":true}',
    '{"a":[' + ",".join(["1"] * bj.MAX_MEMBERS) + "]}",
    "{" + '"a":{' * (bj.MAX_DEPTH - 1) + '"z":1' + "}" * bj.MAX_DEPTH,
])
def test_json_object_takes_objects_within_bounds_then_only_eos(text):
    m = json_object_matcher()
    assert take(m, text) and only_eos_next(m)


@pytest.mark.parametrize("text", [
    '{"a":[' + ",".join(["1"] * (bj.MAX_MEMBERS + 1)),                   # counting on
    "{" + '"a":{' * bj.MAX_DEPTH,                                          # nesting on
    '{"' + "k" * (bj.MAX_KEY + 1),                                          # a key running on
    '{"a":"' + "x" * (bj.MAX_STRING + 1),                                   # a string running on
    '{"a":1' + "0" * 16,                                                # a number running on
    "[1]", '{"a":1} ', '{ "a":1}', '{"a":01}',
])
def test_json_object_refuses_what_would_run_on(text):
    assert not take(json_object_matcher(), text)
