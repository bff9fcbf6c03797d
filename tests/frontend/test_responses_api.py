"""/v1/responses through a real group on `tiny` with its gateway and two API keys
(frontend/http/responses_api.py; docs/http.md, "/v1/responses"): a reply equals the chat
path's for the same conversation, a stream's events come in OpenAI's order and end in the
whole reply, stored replies are read back and continued (previous_response_id) by their
own key only, and bad bodies are 400s naming the field. The real openai SDK's
responses.create and responses.stream are the slow tests."""
from __future__ import annotations

import json
import secrets
from pathlib import Path

import openai
import pytest

from tests.frontend.test_http import assert_openai_error, http

KEY_A, KEY_B = (f"tl-resp-{name}-{secrets.token_urlsafe(12)}" for name in ("a", "b"))
GROUP_ARGS = ["--http-port", "0", "--api-key", KEY_A, "--api-key", KEY_B,
              "--responses-max", "50"]
ASK = {"model": "tiny", "max_output_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def gateway(group) -> str:
    return group.http


def post(gateway: str, body: dict, key: str = KEY_A):
    status, _, reply = http("POST", gateway + "/v1/responses", body,
                            {"Authorization": f"Bearer {key}"})
    return status, reply


def get(gateway: str, response_id: str, key: str = KEY_A):
    status, _, reply = http("GET", f"{gateway}/v1/responses/{response_id}", None,
                            {"Authorization": f"Bearer {key}"})
    return status, reply


def chat(gateway: str, messages: list, max_tokens: int = 6) -> dict:
    status, _, reply = http("POST", gateway + "/v1/chat/completions",
                            {"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                             "temperature": 0}, {"Authorization": f"Bearer {KEY_A}"})
    assert status == 200, reply
    return reply


def text_of(response: dict) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message"
                   for p in item["content"])


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def events_of(raw: str) -> list[dict]:
    """A Responses stream's events, each `event:` line checked against its data's type."""
    out = []
    for block in raw.strip().split("\n\n"):
        head, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}", block
        out.append(event)
    return out


def test_a_reply_is_the_chat_paths_reply_in_the_responses_shape(gateway):
    status, r = post(gateway, {**ASK, "input": "Hello there", "instructions": "Be brief."})
    assert status == 200, r
    want = chat(gateway, [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hello there"}])
    assert r["object"] == "response" and r["id"].startswith("resp_")
    assert text_of(r) == want["choices"][0]["message"]["content"]
    cut = want["choices"][0]["finish_reason"] == "length"
    assert r["status"] == ("incomplete" if cut else "completed")
    if cut:
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    u = r["usage"]
    assert (u["input_tokens"], u["output_tokens"]) == (want["usage"]["prompt_tokens"],
                                                       want["usage"]["completion_tokens"])
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert "output_text" not in r and r["instructions"] == "Be brief." and r["store"] is True


def test_a_stream_says_openais_events_in_order_and_ends_in_the_whole_reply(gateway):
    body = {**ASK, "input": [{"role": "user", "content": [{"type": "input_text",
                                                           "text": "Count: one, two"}]}]}
    _, whole = post(gateway, body)
    status, raw = post(gateway, {**body, "stream": True})
    assert status == 200, raw
    events = events_of(raw)
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    end = "response.completed" if whole["status"] == "completed" else "response.incomplete"
    assert kinds == (["response.created", "response.in_progress",
                      "response.output_item.added", "response.content_part.added"]
                     + ["response.output_text.delta"] * deltas
                     + ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done", end])
    assert deltas >= 1
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert without_ids(final["output"]) == without_ids(whole["output"])
    counts = ("input_tokens", "output_tokens", "total_tokens")   # cached_tokens: the cache's
    assert [final["usage"][k] for k in counts] == [whole["usage"][k] for k in counts]
    assert final["id"] == events[0]["response"]["id"]
    assert "".join(e["delta"] for e in events if "delta" in e) == text_of(whole)
    assert events[0]["response"]["status"] == "in_progress"


def test_a_stored_reply_is_read_back_and_an_unstored_one_is_not(gateway):
    _, r = post(gateway, {**ASK, "input": "keep me"})
    status, back = get(gateway, r["id"])
    assert status == 200 and back == r
    _, gone = post(gateway, {**ASK, "input": "forget me", "store": False})
    status, body = get(gateway, gone["id"])
    assert status == 404 and body["error"]["param"] == "response_id"


def test_previous_response_id_continues_the_conversation(gateway):
    _, first = post(gateway, {**ASK, "input": "My name is Ada."})
    status, second = post(gateway, {**ASK, "input": "What is my name?",
                                    "previous_response_id": first["id"]})
    assert status == 200, second
    want = chat(gateway, [{"role": "user", "content": "My name is Ada."},
                          {"role": "assistant", "content": text_of(first)},
                          {"role": "user", "content": "What is my name?"}])
    assert text_of(second) == want["choices"][0]["message"]["content"]
    assert second["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
    assert second["previous_response_id"] == first["id"]


def test_one_key_cannot_read_or_continue_anothers_reply(gateway):
    _, mine = post(gateway, {**ASK, "input": "secret"}, KEY_A)
    status, body = get(gateway, mine["id"], KEY_B)
    assert status == 404, body
    assert_openai_error(body, 404)
    status, body = post(gateway, {**ASK, "input": "x", "previous_response_id": mine["id"]},
                        KEY_B)
    assert status == 400 and body["error"]["param"] == "previous_response_id"
    assert get(gateway, mine["id"], KEY_A)[0] == 200
    status, _, _ = http("GET", f"{gateway}/v1/responses/{mine['id']}")
    assert status == 401


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s",
                                        "schema": {"type": "nope"}}}}, "text.format"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "n": 2}, "n"),
])
def test_bad_bodies_are_400s_naming_the_field(gateway, body, param):
    status, reply = post(gateway, {**ASK, **body})
    assert status == 400, reply
    assert_openai_error(reply, 400)
    assert reply["error"]["param"] == param, reply


def test_text_format_json_schema_constrains_the_reply(gateway):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    status, r = post(gateway, {**ASK, "max_output_tokens": 40, "input": "ok?",
                               "text": {"format": {"type": "json_schema", "name": "s",
                                                   "schema": schema, "strict": True}}})
    assert status == 200, r
    if r["status"] == "completed":
        assert set(json.loads(text_of(r))) == {"ok"}
    assert r["text"]["format"]["type"] == "json_schema"


def test_the_store_is_a_file_beside_the_step_log(group):
    store = Path(str(group.log)).with_suffix(".responses.db")
    assert store.exists(), list(Path(group.log).parent.iterdir())


# ------------------------------------------------------------------ the openai SDK


@pytest.fixture(scope="module")
def sdk(gateway):
    with openai.OpenAI(base_url=gateway + "/v1", api_key=KEY_A, max_retries=0) as c:
        yield c


@pytest.mark.slow   # the SDK's own parsing of every event and object
def test_the_sdk_creates_streams_and_continues_responses(sdk, gateway):
    r = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.output_text == text_of(get(gateway, r.id)[1])
    again = sdk.responses.retrieve(r.id)
    assert again.output_text == r.output_text
    nxt = sdk.responses.create(model="tiny", input="More", previous_response_id=r.id,
                               max_output_tokens=8, temperature=0)
    assert nxt.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens
    with sdk.responses.stream(model="tiny", input="Hello", max_output_tokens=400,
                              temperature=0, text={"format": {"type": "json_object"}}) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == deltas
    json.loads(deltas)
    streamed = list(sdk.responses.create(model="tiny", input="Hello", max_output_tokens=8,
                                         temperature=0, stream=True))
    assert streamed[-1].response.output_text == r.output_text
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve("resp_unknown")
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="tiny", input=[{"type": "reasoning", "summary": []}])


@pytest.mark.slow   # ~900-token prompts, constrained tokens on tiny
def test_the_sdk_gets_a_named_call_and_answers_it(sdk):
    params = {"type": "object", "properties": {"city": {"type": "string",
                                                        "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "name": "get_weather", "parameters": params}]
    r = sdk.responses.create(model="tiny", input="Weather in Paris?", tools=tools,
                             tool_choice={"type": "function", "name": "get_weather"},
                             max_output_tokens=200, temperature=0)
    calls = [i for i in r.output if i.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1, r
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"] in (
        "Paris", "Rome")
    answer = sdk.responses.create(
        model="tiny", previous_response_id=r.id, max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny"}])
    assert answer.status in ("completed", "incomplete") and answer.output
