"""The Responses API's parts without a group: a body's items read into chat messages
(frontend/http/response_items.py), the store's bound and per-key isolation
(responses_store.py), and the reply's items and stream events (responses_reply.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from frontend.client.common import make_generate
from frontend.http.errors import ApiError
from frontend.http.format import Tally
from frontend.http.response_items import chat_body, input_items, messages
from frontend.http.responses_reply import ResponsesFormat, echoed
from frontend.http.responses_store import ResponsesStore
from frontend.http.schema import GenRequest
from frontend.http.tools import ToolAsk
from frontend.tool_parsers import HERMES


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        chat_body(body)
    assert e.value.status == 400
    return e.value


# ------------------------------------------------------------------ items


def test_a_string_input_is_one_user_message_after_the_instructions():
    got = chat_body({"input": "hi", "instructions": "be brief", "max_output_tokens": 7,
                     "temperature": 0, "model": "m"})
    assert got == {"model": "m", "temperature": 0, "max_tokens": 7,
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}]}


def test_items_of_every_kind_become_chat_messages():
    items = input_items([
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x":1}',
         "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "done", "annotations": []}]}])
    assert messages(items) == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g",
                                                          "arguments": '{"x":1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "done"}]


def test_earlier_items_go_ahead_of_the_input():
    earlier = input_items("first")
    got = chat_body({"input": "second"}, earlier)["messages"]
    assert [m["content"] for m in got] == ["first", "second"]


def test_tools_choice_and_text_format_map_onto_chats_fields():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = chat_body({"input": "x", "tools": [{"type": "function", "name": "f",
                                              "parameters": schema, "strict": True}],
                     "tool_choice": {"type": "function", "name": "f"},
                     "text": {"format": {"type": "json_schema", "name": "s",
                                         "schema": schema, "strict": True}}})
    assert got["tools"] == [{"type": "function", "function": {"name": "f",
                                                              "parameters": schema,
                                                              "strict": True}}]
    assert got["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert got["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": True}}
    assert chat_body({"input": "x", "text": {"format": {"type": "json_object"}}})[
        "response_format"] == {"type": "json_object"}
    assert "response_format" not in chat_body({"input": "x",
                                               "text": {"format": {"type": "text"}}})


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input"),
    ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": "x", "instructions": ["a"]}, "instructions"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"input": "x", "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}, "x": 1}}},
     "text.format"),
    ({"input": "x", "text": {"format": "json"}}, "text.format"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "previous_response_id": 7}, "previous_response_id"),
])
def test_bad_input_is_a_400_naming_the_field(body, param):
    assert refused(body).param == param


# ------------------------------------------------------------------ the store


def response(rid: str) -> dict:
    return {"id": rid, "object": "response", "output": []}


def test_the_store_keeps_at_most_its_count_evicting_the_oldest(tmp_path):
    now = [1000.0]
    store = ResponsesStore(str(tmp_path / "r.db"), max_count=3, max_age_s=60,
                           clock=lambda: now[0])
    for k in range(5):
        now[0] += 1
        store.put("a", response(f"resp_{k}"), [{"k": k}])
    assert store.count() == 3
    assert store.get("a", "resp_0") is None and store.get("a", "resp_1") is None
    assert store.get("a", "resp_4").items == [{"k": 4}]
    store.close()
    reopened = ResponsesStore(str(tmp_path / "r.db"), clock=lambda: now[0])
    assert reopened.get("a", "resp_3").response == response("resp_3")   # it is a file


def test_the_store_forgets_what_is_older_than_its_age():
    now = [0.0]
    store = ResponsesStore(max_age_s=10, clock=lambda: now[0])
    store.put("a", response("resp_old"), [])
    now[0] = 9.0
    assert store.get("a", "resp_old") is not None
    now[0] = 10.5
    assert store.get("a", "resp_old") is None      # expired: never read
    store.put("a", response("resp_new"), [])
    assert store.count() == 1                      # and gone at the next write


def test_one_key_cannot_read_anothers_response():
    store = ResponsesStore()
    store.put("key-a", response("resp_1"), [{"a": 1}])
    assert store.get("key-b", "resp_1") is None
    assert store.get("", "resp_1") is None
    assert store.get("key-a", "resp_1").items == [{"a": 1}]


def test_a_store_file_is_made_only_when_used(tmp_path):
    store = ResponsesStore(str(tmp_path / "r.db"))
    assert not (tmp_path / "r.db").exists()
    store.close()
    with pytest.raises(ValueError):
        ResponsesStore(max_count=0)


# ------------------------------------------------------------------ the reply


def fmt_for(tools: ToolAsk | None = None, kept: list | None = None) -> ResponsesFormat:
    gen = GenRequest(make_generate("p", request_id="r1"), tools=tools)
    return ResponsesFormat("m", gen, echoed({"input": "p"}, None), HERMES,
                           None if kept is None else kept.append)


def tally(text: str, finish: str, prompt: int = 3, out: int = 4) -> list[Tally]:
    t = Tally(0.0, text=text, prompt_tokens=prompt, completion_tokens=out,
              finish_reason=finish, answered=True, metrics={"cached_tokens": 0})
    return [t]


def streamed(fmt: ResponsesFormat, parts: list[str], finish: str) -> list[dict]:
    tallies = tally("".join(parts), finish)
    events = fmt.opening(tallies)
    for k, text in enumerate(parts):
        last = k == len(parts) - 1
        events += fmt.chunk(tallies, 0, SimpleNamespace(text=text,
                                                        finish_reason=finish if last else None))
    events += fmt.closing(tallies)
    return [json.loads(fmt.frame(e).split(b"data: ", 1)[1]) for e in events]


def test_a_text_reply_is_one_message_and_its_stream_says_the_same():
    kept = []
    whole = fmt_for(kept=kept).body(tally("Hello there", "stop"))
    assert whole["status"] == "completed" and whole["incomplete_details"] is None
    assert whole["output"] == [{"id": "msg_r1_0", "type": "message", "status": "completed",
                                "role": "assistant", "content": [
                                    {"type": "output_text", "text": "Hello there",
                                     "annotations": [], "logprobs": []}]}]
    assert whole["usage"]["input_tokens"] == 3 and whole["usage"]["total_tokens"] == 7
    assert kept == [whole]
    events = streamed(fmt_for(), ["Hello", " there"], "stop")
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["output"] == whole["output"]


def test_a_reply_cut_at_the_limit_is_incomplete():
    whole = fmt_for().body(tally("Hel", "length"))
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["output"][0]["status"] == "incomplete"
    assert streamed(fmt_for(), ["Hel"], "length")[-1]["type"] == "response.incomplete"


def test_calls_become_function_call_items_in_the_stream_and_the_whole():
    tools = ToolAsk(({"type": "function", "function": {"name": "f"}},), "auto")
    text = ('Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
            '<tool_call>\n{"name": "f", "arguments": {"a": 2}}\n</tool_call>')
    whole = fmt_for(tools).body(tally(text, "stop"))
    assert [i["type"] for i in whole["output"]] == ["message", "function_call",
                                                    "function_call"]
    calls = whole["output"][1:]
    assert [json.loads(c["arguments"]) for c in calls] == [{"a": 1}, {"a": 2}]
    assert calls[0]["call_id"] != calls[1]["call_id"]
    events = streamed(fmt_for(tools), [text[:20], text[20:]], "stop")
    assert events[-1]["response"]["output"] == whole["output"]
    kinds = [e["type"] for e in events]
    assert kinds.count("response.function_call_arguments.done") == 2
    one = fmt_for(ToolAsk(tools.tools, "auto", parallel=False)).body(tally(text, "stop"))
    assert [i["type"] for i in one["output"]] == ["message", "function_call"]
