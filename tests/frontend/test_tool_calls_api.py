"""Tool calls through the gateway with the openai SDK, on `tiny` (one group and gateway for
the module; docs/structured.md, "Tool calls"): `required` and a named function return valid
calls, whole and in a stream the SDK accumulates, a second turn with the tool's result is
served, and the refusals are 400s naming the field. The random model cannot be asked to
call tools of its own accord, so `auto` is covered by the parsers' tests
(tests/frontend/test_tool_parsers.py, tests/frontend/test_tool_calls.py)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.frontend import test_http

gateway, oai, engine = test_http.gateway, test_http.oai, test_http.engine  # shared fixtures

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "time"}}]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "time": {"type": "object", "maxProperties": 0}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
ASK = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
           parallel_tool_calls=False)


def _valid(calls) -> None:
    assert len(calls) == 1
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.slow  # ~900-token prompts, 200 constrained tokens on tiny
def test_required_returns_a_valid_call(oai):
    r = oai.chat.completions.create(tool_choice="required", **ASK)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    _valid(choice.message.tool_calls)
    again = oai.chat.completions.create(tool_choice="required", **ASK)
    assert again.choices[0].message.tool_calls[0].function == choice.message.tool_calls[0].function


@pytest.mark.slow  # ~900-token prompts, 200 constrained tokens on tiny
def test_a_named_function(oai):
    r = oai.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "time"}}, **ASK)
    calls = r.choices[0].message.tool_calls
    _valid(calls)
    assert calls[0].function.name == "time" and r.choices[0].finish_reason == "tool_calls"


@pytest.mark.slow  # ~900-token prompts, 200 constrained tokens on tiny
def test_a_stream_accumulated_by_the_sdk_equals_the_whole_reply(oai):
    whole = oai.chat.completions.create(tool_choice="required", **ASK).choices[0]
    stream = getattr(oai.chat.completions, "stream", None) or oai.beta.chat.completions.stream
    with stream(tool_choice="required", **ASK) as s:
        final = s.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    _valid(final.message.tool_calls)
    # the SDK's stream helper gives ParsedFunction, create() Function: compare their fields
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]


@pytest.mark.slow  # ~900-token prompts, 200 constrained tokens on tiny
def test_a_second_turn_with_the_tool_result(oai):
    first = oai.chat.completions.create(tool_choice="required", **ASK).choices[0].message
    call = first.tool_calls[0]
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r = oai.chat.completions.create(**{**ASK, "messages": history, "max_tokens": 8,
                                       "tool_choice": "none"})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("param,kw", [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
    ("tools", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "x"}}}}}]}),
    ("tool_choice", {"tools": TOOLS,
                     "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    ("tool_choice", {"tool_choice": "required"}),
])
def test_refusals_name_the_field(oai, param, kw):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **kw)
    assert e.value.param == param, e.value.body
