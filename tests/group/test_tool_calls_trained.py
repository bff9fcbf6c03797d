"""Tool calls that finish on the trained model (`scripts/serve --model smollm2`, through the
gateway; docs/structured.md, "Tool calls"): `required` (parallel or not), a named function
whose schema says nothing of additionalProperties (issue 52's run-on), and a stream each end
`finish_reason: "tool_calls"` with arguments valid under their schema and no call text in
content; `json_object` ends `stop` with one object; and scripts/bench tool_calls runs on 4
prompts against the same gateway."""
from __future__ import annotations

import json

import jsonschema
import pytest

from scripts.benchmarks import tool_calls as bench

from tests.frontend.test_http import http

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]   # test_trained_serving's group

WEATHER_PARAMS = {"type": "object", "properties": {        # no additionalProperties
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": WEATHER_PARAMS}}
TIMER = {"type": "function", "function": {
    "name": "set_timer", "description": "Set a timer",
    "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                   "required": ["minutes"]}}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "set_timer": TIMER["function"]["parameters"]}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(group, question: str, **extra) -> dict:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": question}],
            "tools": [WEATHER, TIMER], "max_tokens": 512, "temperature": 0, **extra}
    status, _, reply = http("POST", f"{group.http}/v1/chat/completions", body, timeout=300)
    assert status == 200, reply
    return reply["choices"][0]


def assert_calls_finish(choice: dict, most: int) -> list[dict]:
    """The reply ended on its own with 1..most calls, each valid; no call text in content."""
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert 1 <= len(calls) <= most
    for c in calls:
        args = json.loads(c["function"]["arguments"])
        jsonschema.validate(args, SCHEMAS[c["function"]["name"]])
    assert "<tool_call>" not in (choice["message"]["content"] or "")
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("extra,most", [
    ({"tool_choice": "required"}, 8),                                  # parallel: default on
    ({"tool_choice": "required", "parallel_tool_calls": True}, 8),
    ({"tool_choice": "required", "parallel_tool_calls": False}, 1),
    ({"tool_choice": NAMED}, 1),
    ({"tool_choice": NAMED, "parallel_tool_calls": False}, 1),
], ids=["required", "required-parallel", "required-one", "named", "named-one"])
@pytest.mark.parametrize("question", ["What's the weather in Paris?",
                                      "Is it cold in Oslo today, in celsius?"])
def test_required_and_named_end_with_valid_calls(group, extra, most, question):
    calls = assert_calls_finish(chat(group, question, **extra), most)
    if "function" in extra["tool_choice"]:
        assert [c["function"]["name"] for c in calls] == ["get_weather"]


@pytest.mark.slow
def test_a_stream_ends_with_its_calls(group):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Set a timer for 5 "
                                              "minutes."}], "tools": [WEATHER, TIMER],
            "tool_choice": "required", "max_tokens": 256, "temperature": 0, "stream": True}
    status, _, text = http("POST", f"{group.http}/v1/chat/completions", body, timeout=300)
    assert status == 200
    chunks = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls = [tc for d in deltas for tc in d["delta"].get("tool_calls", [])]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    assert deltas[-1]["finish_reason"] == "tool_calls" and calls
    assert "<tool_call>" not in content
    for c in calls:
        jsonschema.validate(json.loads(c["function"]["arguments"]),
                            SCHEMAS[c["function"]["name"]])


@pytest.mark.slow
@pytest.mark.parametrize("question", [
    "Describe a cat as a JSON object with its name, age and colour.",
    "Give me a JSON object with three fruits and their colours."])
def test_json_object_closes_and_ends(group, question):
    body = {"model": "smollm2", "max_tokens": 256, "temperature": 0,
            "messages": [{"role": "user", "content": question}],
            "response_format": {"type": "json_object"}}
    status, _, reply = http("POST", f"{group.http}/v1/chat/completions", body, timeout=300)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert isinstance(json.loads(choice["message"]["content"]), dict)


@pytest.mark.slow
def test_the_benchmark_on_four_prompts(group, tmp_path, capsys):
    out = tmp_path / "tool-calls.json"
    rc = bench.main(["--http", group.http, "--prompts", "4", "--max-tokens", "1024",
                     "--json", str(out), "--allow-dirty", "--concurrency", "4"])
    doc = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert doc["benchmark"] == "tool_calls" and list(doc["results"]) == ["auto", "required",
                                                                         "named"]
    for mode, r in doc["results"].items():
        assert r["requests"] == 4 and r["errors"] == 0 and r["leaked"] == 0, (mode, r)
    for mode in ("required", "named"):
        assert doc["results"][mode]["ok_share"] == 1.0, doc["results"][mode]
    assert doc["goal_met"] is True
