"""The gateway's request mapping and reply shapes, in-process against a recording stand-in
for the AsyncClient (no engine): every body field reaches the engine request it maps to,
n choices fan out and merge, logprobs, echo, usage and `tl` take OpenAI's shapes.
tests/frontend/test_http_api.py checks the same against the real engine.
"""
from __future__ import annotations

import asyncio
import itertools
import json

from aiohttp.test_utils import TestClient, TestServer

from core.ipc.protocol import Delta
from frontend.client.common import ClientError
from frontend.http.app import Gateway, make_app
from frontend.http.chat_special import ChatPrompt
from frontend.http.metrics import Metrics
from tests.frontend.test_http import sse_events

METRICS = {"queue_ms": 1.0, "ttft_ms": 2.0, "e2e_ms": 3.0, "preemptions": 0, "priority": 0,
           "cached_tokens": 0, "log": "x.db", "log_id": 4}


class FakeTokenizer:
    """Stands in for the HF tokenizer: token i reads "<i>"."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def __len__(self):
        return 100


class FakeChat:
    tokenizer = FakeTokenizer()
    tool_format = "hermes"

    def prompt(self, messages, options=None, tools=None):
        return ChatPrompt("|".join(m["content"] for m in messages))


def two_tokens(kw: dict) -> list:
    """Per request: "a" (token 1), then "b" (token 2) finishing "length"; with logprobs
    asked, each token's and the top 2."""
    lp = kw["logprobs"] is not None
    rid = kw["request_id"]
    return [Delta(rid, "a", [1], None, [7, 8], [-0.5] if lp else None,
                  [[[1, -0.5], [2, -1.0]]] if lp else None),
            Delta(rid, "b", [2], "length", None, [-0.25] if lp else None,
                  [[[2, -0.25], [1, float("-inf")]]] if lp else None,
                  dict(METRICS, log_id=rid))]


class Recording:
    """Stands in for AsyncClient: records each stream's arguments and its closing; the
    deltas come from `script(kwargs)` (an Exception in it is raised)."""

    def __init__(self, script=two_tokens):
        self.script, self.calls, self.closed = script, [], []

    def stream(self, **kw):
        self.calls.append(kw)
        return self._stream(kw)

    async def _stream(self, kw):
        try:
            for item in self.script(kw):
                await asyncio.sleep(0)   # a loop turn per delta, as a real stream
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed.append(kw["request_id"])

    async def stats(self):
        return {"pids": {}}


def post(client, path: str, body: dict, headers: dict | None = None) -> tuple[int, str]:
    async def run():
        app = make_app(Gateway(client, "m", 64, FakeChat(), Metrics(), 0))
        async with TestClient(TestServer(app)) as c:
            r = await c.post(path, json=body, headers=headers or {})
            return r.status, await r.text()
    return asyncio.run(run())


def completion(body: dict, client=None, headers=None) -> tuple[Recording, dict | list]:
    client = client or Recording()
    status, text = post(client, "/v1/completions", {"prompt": "hi", **body}, headers)
    assert status == 200, text
    return client, sse_events(text) if body.get("stream") else json.loads(text)


def chat(body: dict, client=None) -> tuple[Recording, dict | list]:
    client = client or Recording()
    status, text = post(client, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], **body})
    assert status == 200, text
    return client, sse_events(text) if body.get("stream") else json.loads(text)


# ------------------------------------------------------------------ the engine request


def test_every_field_reaches_the_engine_request():
    body = {"seed": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.5, "min_p": 0.1, "min_tokens": 2, "max_tokens": 9,
            "stop_token_ids": [5, 6], "include_stop_str_in_output": True,
            "skip_special_tokens": False, "ignore_eos": True, "top_k": -1, "user": "u1",
            "priority": 7, "temperature": 0.5, "top_p": 0.9, "stop": "x"}
    (kw,) = completion(body)[0].calls
    want = dict(body, top_k=0, stop=["x"], add_special_tokens=True, logprobs=None)
    assert {k: kw[k] for k in want} == want
    (kw,) = completion({"add_special_tokens": False})[0].calls
    assert kw["add_special_tokens"] is False and kw["priority"] == 0


def test_the_priority_header_wins_over_the_body():
    (kw,) = completion({"priority": 7}, headers={"X-TL-Priority": "-9"})[0].calls
    assert kw["priority"] == -9


def test_chat_sends_the_template_without_added_special_tokens():
    (kw,) = chat({"max_completion_tokens": 5})[0].calls
    assert (kw["prompt"], kw["add_special_tokens"], kw["max_tokens"]) == ("hi", False, 5)
    (kw,) = chat({"add_special_tokens": True, "logprobs": True})[0].calls
    assert kw["add_special_tokens"] is True and kw["logprobs"] == 0
    (kw,) = chat({"logprobs": True, "top_logprobs": 3})[0].calls
    assert kw["logprobs"] == 3


def test_n_fans_out_with_ids_and_seeds_per_choice():
    client, body = completion({"n": 3, "seed": 2 ** 63 - 2})
    rid = body["id"].removeprefix("cmpl-")
    assert [c["request_id"] for c in client.calls] == [f"{rid}-{i}" for i in range(3)]
    assert [c["seed"] for c in client.calls] == [2 ** 63 - 2, 2 ** 63 - 1, 0]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == "ab" for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    client, _ = completion({"n": 2})
    assert [c["seed"] for c in client.calls] == [None, None]


def test_one_failing_choice_fails_the_reply_and_aborts_the_others():
    def script(kw):
        if kw["request_id"].endswith("-1"):
            return [ClientError(429, "queue full")]
        return itertools.repeat(Delta(kw["request_id"], "a", [1], None, [7]))
    client = Recording(script)
    status, text = post(client, "/v1/completions", {"prompt": "hi", "n": 3})
    assert status == 429, text
    assert sorted(c[-2:] for c in client.closed) == ["-0", "-1", "-2"]


# ------------------------------------------------------------------ reply shapes


def test_completion_logprobs_shape():
    _, body = completion({"logprobs": 2})
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["<1>", "<2>"], "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"<1>": -0.5, "<2>": -1.0}, {"<2>": -0.25, "<1>": -9999.0}],
        "text_offset": [0, 3]}
    _, events = completion({"logprobs": 2, "stream": True})
    assert [e["choices"][0]["logprobs"]["text_offset"] for e in events] == [[0], [3]]
    assert [e["choices"][0]["logprobs"]["tokens"] for e in events] == [["<1>"], ["<2>"]]
    _, body = completion({})
    assert body["choices"][0]["logprobs"] is None


def test_chat_logprobs_shape():
    _, body = chat({"logprobs": True, "top_logprobs": 2})
    first = body["choices"][0]["logprobs"]["content"][0]
    assert first == {"token": "<1>", "logprob": -0.5, "bytes": list(b"<1>"),
                     "top_logprobs": [{"token": "<1>", "logprob": -0.5, "bytes": list(b"<1>")},
                                      {"token": "<2>", "logprob": -1.0,
                                       "bytes": list(b"<2>")}]}
    _, events = chat({"logprobs": True, "stream": True})
    parts = [e["choices"][0]["logprobs"] for e in events[1:]]
    assert [[c["token"] for c in p["content"]] for p in parts] == [["<1>"], ["<2>"]]


def test_logprobs_of_a_token_without_text_ride_on_the_next_chunk():
    def script(kw):
        rid = kw["request_id"]
        return [Delta(rid, "", [1], None, [7], [-0.5], [[]]),
                Delta(rid, "ab", [2], "stop", None, [-0.25], [[]])]
    _, events = completion({"logprobs": 0, "stream": True}, Recording(script))
    assert len(events) == 1
    assert events[0]["choices"][0]["logprobs"]["tokens"] == ["<1>", "<2>"]


def test_echo_prepends_the_prompt():
    _, body = completion({"echo": True})
    assert body["choices"][0]["text"] == "hiab"
    _, body = completion({"echo": True, "prompt": [3, 4]})
    assert body["choices"][0]["text"] == "<3><4>ab"
    _, events = completion({"echo": True, "stream": True, "n": 2})
    firsts = {}
    for e in events:
        firsts.setdefault(e["choices"][0]["index"], e["choices"][0]["text"])
    assert firsts == {0: "hia", 1: "hia"}


def test_usage_in_a_stream_only_when_asked():
    _, events = completion({"stream": True})
    assert all("usage" not in e for e in events)
    assert events[-1]["tl"]["log_id"] == events[-1]["id"].removeprefix("cmpl-")
    assert all("tl" not in e for e in events[:-1])
    _, events = chat({"stream": True, "stream_options": {"include_usage": True}})
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 2
    assert "tl" in last and all("usage" not in e and "tl" not in e for e in chunks)


def test_tl_on_the_reply_and_on_each_choice_for_n():
    _, body = completion({})
    assert body["tl"] == dict(METRICS, log_id=body["id"].removeprefix("cmpl-"))
    assert "tl" not in body["choices"][0]
    _, body = chat({"n": 2})
    rid = body["id"].removeprefix("chatcmpl-")
    assert body["tl"]["log_id"] == f"{rid}-0"
    assert [c["tl"]["log_id"] for c in body["choices"]] == [f"{rid}-0", f"{rid}-1"]


def test_n_streams_interleave_choices_with_their_index():
    _, events = chat({"n": 3, "stream": True})
    texts: dict[int, str] = {}
    for e in events:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["delta"].get("content", "")
        if c["finish_reason"]:
            assert c["tl"]["log_id"].endswith(f"-{c['index']}")
    assert texts == {0: "ab", 1: "ab", 2: "ab"}
    assert events[-1]["tl"]["log_id"].endswith("-0")
