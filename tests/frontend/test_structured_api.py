"""Structured outputs through the interfaces, on `tiny` (one group and gateway for the
module): OpenAI's response_format and vLLM's structured_outputs over HTTP on both routes,
the same as Client.generate keywords, and every refusal a 400 naming its field
(docs/structured.md). The group's step log must verify at teardown, constraints included."""
from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from frontend.client import ClientError
from frontend.structured import MAX_CONSTRAINT_CHARS
from tests.frontend import test_http
from tests.worker.test_structured_worker import CHOICES, REGEX, SCHEMAS

gateway, oai, engine = test_http.gateway, test_http.oai, test_http.engine  # shared fixtures

MESSAGES = [{"role": "user", "content": "Give me JSON"}]


class Pick(pydantic.BaseModel):
    """Bounded fields only: a random model ends inside max_tokens."""
    colour: Literal["red", "green", "blue"]
    count: int = pydantic.Field(ge=0, le=9)


class Order(pydantic.BaseModel):
    """A nested model ($defs and $ref in what the SDK sends) and a bounded array."""
    pick: Pick
    tags: list[Literal["a", "b"]] = pydantic.Field(max_length=2)


def test_client_keywords(engine):
    r = engine.generate("x", max_tokens=40, structured_outputs={"regex": REGEX})
    assert re.fullmatch(REGEX, r.text) and r.finish_reason == "stop"
    r = engine.generate("y", max_tokens=40, structured_outputs={"choice": CHOICES})
    assert r.text in CHOICES and r.finish_reason == "stop"
    for i, s in enumerate(SCHEMAS):
        r = engine.generate(f"z{i}", max_tokens=80, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": s, "strict": True}})
        jsonschema.validate(json.loads(r.text), s)
        assert r.finish_reason == "stop"


def test_http_response_format_on_chat(oai):
    for s in SCHEMAS:
        r = oai.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=80, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "out", "schema": s, "strict": True}})
        jsonschema.validate(json.loads(r.choices[0].message.content), s)
        assert r.choices[0].finish_reason == "stop"


def test_http_structured_outputs_on_completions(oai):
    r = oai.completions.create(model="tiny", prompt="pick", max_tokens=20,
                               extra_body={"structured_outputs": {"choice": CHOICES}})
    assert r.choices[0].text in CHOICES
    r = oai.completions.create(model="tiny", prompt="re", max_tokens=20, stream=True,
                               extra_body={"structured_outputs": {"regex": REGEX}})
    assert re.fullmatch(REGEX, "".join(c.choices[0].text for c in r))


BAD = [
    ("response_format", {"response_format": {"type": "xml"}}),
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": 5}}}}),
    ("structured_outputs", {"structured_outputs": {"regex": "[a-"}}),
    ("structured_outputs", {"structured_outputs": {"regex": "a", "choice": ["b"]}}),
    ("structured_outputs", {"structured_outputs": {"choice": []}}),
    ("structured_outputs", {"structured_outputs": {"grammar": "start: nothing_defined"}}),
    ("structured_outputs", {"structured_outputs": {"regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}}),
    ("structured_outputs", {"structured_outputs": {"json": {"type": "object"}},
                            "response_format": {"type": "json_object"}}),
]


@pytest.mark.parametrize("param,body", BAD, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BAD)])
def test_bad_constraints_are_400_naming_the_field(oai, engine, param, body):
    fmt = body.pop("response_format", None)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                    response_format=fmt or openai.NOT_GIVEN, extra_body=body)
    assert e.value.param == param, e.value.body
    with pytest.raises(ClientError) as z:
        engine.generate("x", max_tokens=4, response_format=fmt, **body)
    assert z.value.code == 400 and z.value.param == param


@pytest.mark.parametrize("model", [Pick, Order])
def test_the_sdk_parse_helper(oai, model):
    """The SDK sends pydantic's schema made strict (additionalProperties false, every property
    required, titles) with strict true, and parses the reply into the model."""
    r = oai.beta.chat.completions.parse(model="tiny", messages=MESSAGES, max_tokens=80,
                                        response_format=model)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, model)
    assert msg.parsed == model.model_validate_json(msg.content)


def test_the_sdk_parse_helper_with_a_strict_tool(oai):
    """A pydantic function tool (strict, as the SDK makes it) named by tool_choice: the call's
    arguments parse into the model."""
    r = oai.beta.chat.completions.parse(
        model="tiny", messages=MESSAGES, max_tokens=200,   # the call's markup is ~70 tokens
        tools=[openai.pydantic_function_tool(Pick)],
        tool_choice={"type": "function", "function": {"name": "Pick"}})
    call, = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "Pick"
    assert isinstance(call.function.parsed_arguments, Pick)
