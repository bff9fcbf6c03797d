"""litellm 1.110.2 against the gateway on the trained smollm2, the gateway named as its docs
say for an OpenAI-compatible server ("openai/<model>", api_base); slow: litellm is installed on
first use into a venv of its own (scripts/evaltools/toolenv.py) and each flow runs there as an
app would (scripts/evaltools/clients/litellm_flows.py).

- `completion` with tools and a named tool_choice, "required", and "required" streamed (the
  chunks rebuilt by litellm's stream_chunk_builder): finish_reason tool_calls, each call's
  arguments valid JSON under the schema sent, no markup in content.
- `completion` with response_format json_schema (strict): content valid under the schema.
- `completion(stream=True)` with include_usage: the real answer in many chunks, with usage.
- `acompletion`: two at once on one event loop, both the same real answer.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from scripts.evaltools.toolenv import LITELLM

from tests.clients.checks import assert_valid_calls, flows

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]   # test_trained_serving's group
pytestmark = pytest.mark.tool_venvs(LITELLM)


@pytest.fixture(scope="module")
def flow(group):
    return flows(LITELLM, "litellm_flows.py", group.http)


@pytest.mark.slow
@pytest.mark.parametrize("name,most,only", [
    ("tools_named", 1, "get_weather"), ("tools_required", 8, None),
    ("tools_required_stream", 8, None)])
def test_completion_with_tools_gives_valid_calls(flow, name, most, only):
    assert_valid_calls(flow(name), most, only)


@pytest.mark.slow
def test_completion_with_a_json_schema_holds_to_it(flow):
    out = flow("json_schema")
    assert out["finish_reason"] == "stop", out
    jsonschema.validate(json.loads(out["content"]), out["schema"])


@pytest.mark.slow
def test_a_stream_gives_the_answer_in_chunks_with_usage(flow):
    out = flow("stream")
    assert "Paris" in out["content"] and out["finish_reason"] == "stop", out
    assert out["chunks"] > 2 and out["usage"]["completion_tokens"] > 0, out


@pytest.mark.slow
def test_acompletion_answers_two_at_once(flow):
    first, second = flow("acompletion")["replies"]
    assert "Paris" in first["content"] and first["finish_reason"] == "stop", first
    assert second["content"] == first["content"]
