"""langchain-openai 1.8.1's ChatOpenAI against the gateway on the trained smollm2 (slow: the
library is installed on first use into a venv of its own, scripts/evaltools/toolenv.py, and
each flow runs in that venv as an app would, scripts/evaltools/clients/langchain_flows.py).

- `invoke` and `stream` (stream_usage on): the same real answer, the stream in many chunks,
  with usage.
- `with_structured_output(Person)` by each method: json_schema (response_format, strict),
  function_calling (a named tool) and json_mode (json_object, the prompt names the keys) each
  hand back a parsed Person valid under its schema, no parsing error.
- `bind_tools` with a named tool_choice, "any" (langchain sends "required") and "required",
  invoked and streamed (chunks summed by langchain): non-empty tool_calls, each one's args
  valid under the schema langchain sent, nothing in invalid_tool_calls, no markup in content.
  With auto the model may answer in text: either valid calls or text with no markup left.
- `ChatOpenAI(use_responses_api=True)`: invoke and stream through /v1/responses give the
  chat route's answer, status completed, with usage.
"""
from __future__ import annotations

import jsonschema
import pytest

from scripts.evaltools.toolenv import LANGCHAIN_OPENAI

from tests.clients.checks import assert_no_markup, assert_valid_calls, flows

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]   # test_trained_serving's group
pytestmark = pytest.mark.tool_venvs(LANGCHAIN_OPENAI)


@pytest.fixture(scope="module")
def flow(group):
    return flows(LANGCHAIN_OPENAI, "langchain_flows.py", group.http)


def assert_answer(out: dict) -> None:
    assert "Paris" in out["content"], out
    assert out["usage"]["output_tokens"] > 0 and out["usage"]["input_tokens"] > 0, out


@pytest.mark.slow
def test_invoke_and_stream_give_the_same_answer(flow):
    invoked, streamed = flow("invoke"), flow("stream")
    assert_answer(invoked)
    assert invoked["finish_reason"] == "stop"
    assert streamed["content"] == invoked["content"] and streamed["chunks"] > 2, streamed
    assert streamed["finish_reason"] == "stop"
    assert streamed["usage"]["output_tokens"] == invoked["usage"]["output_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output_parses_a_valid_object(flow, method):
    out = flow(f"structured_{method}")
    assert out["parsing_error"] is None and out["parsed"] is not None, out
    jsonschema.validate(out["parsed"], out["schema"])
    want = "tool_calls" if method == "function_calling" else "stop"
    assert out["raw"]["finish_reason"] == want, out


@pytest.mark.slow
@pytest.mark.parametrize("name,most,only", [
    ("tools_named", 1, "get_weather"), ("tools_named_stream", 1, "get_weather"),
    ("tools_any", 8, None), ("tools_required", 8, None), ("tools_required_stream", 8, None)])
def test_bind_tools_forced_gives_valid_calls(flow, name, most, only):
    assert_valid_calls(flow(name), most, only)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tools_auto", "tools_auto_stream"])
def test_bind_tools_auto_gives_valid_calls_or_clean_text(flow, name):
    out = flow(name)
    if out["tool_calls"]:
        assert_valid_calls(out)
    else:
        assert out["content"].strip() and not out["invalid_tool_calls"], out
        assert out["finish_reason"] in ("stop", "length"), out
        assert_no_markup(out["content"])


@pytest.mark.slow
def test_the_responses_api_invokes_and_streams(flow):
    chat, invoked, streamed = flow("invoke"), flow("responses_invoke"), flow("responses_stream")
    assert_answer(invoked)
    assert invoked["content"] == streamed["content"] == chat["content"]
    assert invoked["status"] == streamed["status"] == "completed"
    assert streamed["chunks"] > 2
    tokens = ("input_tokens", "output_tokens")   # cache_read may differ: the prefix cache
    assert [streamed["usage"][k] for k in tokens] == [invoked["usage"][k] for k in tokens]
