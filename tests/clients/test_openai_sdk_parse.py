"""The openai SDK's own parse helpers on the trained smollm2 through the gateway (slow).

tests/frontend/test_structured_api.py runs the same helpers on `tiny`, whose random weights
never stray from the grammar's shortest path; issue 52 saw the trained model run on until
max_tokens there (the SDK's LengthFinishReasonError). Here both end on their own:
`chat.completions.parse` with a pydantic model gives a parsed instance, and with
`pydantic_function_tool` named by tool_choice a call whose parsed_arguments is the model."""
from __future__ import annotations

import openai
import pydantic
import pytest

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]   # test_trained_serving's group


class Person(pydantic.BaseModel):
    name: str
    age: int


class GetWeather(pydantic.BaseModel):
    """Get the current weather in a city."""
    city: str


@pytest.fixture(scope="module")
def oai(group):
    with openai.OpenAI(base_url=group.http + "/v1", api_key="unused", max_retries=0,
                       timeout=300) as client:
        yield client


@pytest.mark.slow
def test_parse_with_a_pydantic_model(oai):
    r = oai.chat.completions.parse(
        model="smollm2", temperature=0, max_tokens=256, response_format=Person,
        messages=[{"role": "user", "content": "Alice is 30 years old. Give her name and age."}])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, Person) and msg.parsed == Person.model_validate_json(msg.content)


@pytest.mark.slow
def test_parse_with_a_pydantic_function_tool(oai):
    r = oai.chat.completions.parse(
        model="smollm2", temperature=0, max_tokens=256,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    call, = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert "<tool_call>" not in (r.choices[0].message.content or "")
