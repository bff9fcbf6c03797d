"""Prompt logprobs at the gateway, in-process against a recording stand-in for the
AsyncClient (tests/test_http_api_shapes.py's): echo with logprobs in OpenAI's legacy shape,
max_tokens 0 with echo, prompt_logprobs in vLLM's shape on both routes, and the 400s.
tests/test_prompt_logprobs_api.py checks the same against the real engine."""
from __future__ import annotations

import json

import pytest

from core.ipc.protocol import Delta
from tests.test_http_api_shapes import Recording, chat, completion, post

# the prompt [7, 8, 9]: position 1 (token 8) and 2 (token 9) scored, best alternatives first
PROMPT_LP = [None, [-1.5, 2, [[3, -0.5], [8, -1.5], [4, -2.0]]],
             [float("-inf"), 40, [[5, -0.1], [6, -0.2], [3, -3.0]]]]


def scored(kw: dict) -> list:
    """As two_tokens, with the prompt's logprobs (3 alternatives) on the first delta when
    the engine request asks for them."""
    rid, asked = kw["request_id"], kw["prompt_logprobs"] is not None
    lp = kw["logprobs"] is not None
    first = Delta(rid, "a", [1], None, [7, 8, 9], [-0.5] if lp else None,
                  [[[1, -0.5], [2, -1.0]]] if lp else None)
    if asked:   # the engine's N alternatives
        n = kw["prompt_logprobs"]
        first.prompt_logprobs = [e and [e[0], e[1], e[2][:n]] for e in PROMPT_LP]
    return [first, Delta(rid, "b", [2], "length", None, [-0.25] if lp else None,
                         [[[2, -0.25], [1, -1.0]]] if lp else None, {"log_id": rid})]


def test_echo_with_logprobs_puts_the_prompt_first():
    client, body = completion({"echo": True, "logprobs": 2, "prompt": [7, 8, 9]},
                              Recording(scored))
    assert client.calls[0]["prompt_logprobs"] == 2 and client.calls[0]["max_tokens"] == 16
    (choice,) = body["choices"]
    assert choice["text"] == "<7><8><9>ab"
    assert choice["logprobs"] == {
        "tokens": ["<7>", "<8>", "<9>", "<1>", "<2>"],
        "token_logprobs": [None, -1.5, -9999.0, -0.5, -0.25],
        "top_logprobs": [None, {"<3>": -0.5, "<8>": -1.5}, {"<5>": -0.1, "<6>": -0.2},
                         {"<1>": -0.5, "<2>": -1.0}, {"<2>": -0.25, "<1>": -1.0}],
        "text_offset": [0, 3, 6, 9, 12]}
    assert "prompt_logprobs" not in choice


def test_echo_with_logprobs_streams_the_prompt_in_the_first_chunk():
    _, events = completion({"echo": True, "logprobs": 1, "prompt": [7, 8, 9], "stream": True},
                           Recording(scored))
    first = events[0]["choices"][0]
    assert first["text"] == "<7><8><9>a"
    assert first["logprobs"]["tokens"] == ["<7>", "<8>", "<9>", "<1>"]
    assert first["logprobs"]["token_logprobs"][:3] == [None, -1.5, -9999.0]
    assert first["logprobs"]["top_logprobs"][:3] == [None, {"<3>": -0.5}, {"<5>": -0.1}]
    assert events[1]["choices"][0]["logprobs"]["text_offset"] == [12]


def test_max_tokens_0_with_echo_scores_the_prompt_alone():
    client, body = completion({"echo": True, "logprobs": 0, "max_tokens": 0,
                               "prompt": [7, 8, 9]}, Recording(scored))
    assert client.calls[0]["max_tokens"] == 1   # the engine's one token is dropped
    (choice,) = body["choices"]
    assert choice["text"] == "<7><8><9>" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["<7>", "<8>", "<9>"]
    assert choice["logprobs"]["top_logprobs"] == [None, {}, {}]
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == 3
    _, events = completion({"echo": True, "max_tokens": 0, "stream": True, "prompt": [7, 8]},
                           Recording(scored))
    assert "".join(e["choices"][0]["text"] for e in events) == "<7><8>"


def vllm_expected(top: int) -> list:
    return [None,
            {**{str(a): {"logprob": b, "rank": k + 1, "decoded_token": f"<{a}>"}
                for k, (a, b) in enumerate(PROMPT_LP[1][2][:top])},
             "8": {"logprob": -1.5, "rank": 2, "decoded_token": "<8>"}},
            {**{str(a): {"logprob": b, "rank": k + 1, "decoded_token": f"<{a}>"}
                for k, (a, b) in enumerate(PROMPT_LP[2][2][:top])},
             "9": {"logprob": -9999.0, "rank": 40, "decoded_token": "<9>"}}]


def test_prompt_logprobs_in_vllms_shape_on_both_routes():
    client, body = completion({"prompt_logprobs": 2, "prompt": [7, 8, 9], "n": 2},
                              Recording(scored))
    assert [c["prompt_logprobs"] for c in client.calls] == [2, 2]
    for choice in body["choices"]:
        assert choice["prompt_logprobs"] == vllm_expected(2)
        assert choice["logprobs"] is None and choice["text"] == "ab"
    _, body = chat({"prompt_logprobs": 3}, Recording(scored))
    assert body["prompt_logprobs"] == vllm_expected(3)
    assert "prompt_logprobs" not in body["choices"][0]
    _, body = chat({}, Recording(scored))
    assert "prompt_logprobs" not in body


def test_echo_logprobs_and_prompt_logprobs_ask_the_engine_once_for_the_larger():
    client, body = completion({"echo": True, "logprobs": 1, "prompt_logprobs": 3,
                               "prompt": [7, 8, 9]}, Recording(scored))
    assert client.calls[0]["prompt_logprobs"] == 3
    (choice,) = body["choices"]
    assert choice["prompt_logprobs"] == vllm_expected(3)
    assert choice["logprobs"]["top_logprobs"][1] == {"<3>": -0.5}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "prompt_logprobs": 99}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": "2"}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0, "echo": True, "min_tokens": 1},
     "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 21}, "logprobs"),
])
def test_bad_prompt_logprobs_bodies_are_400_naming_the_field(path, body, param):
    client = Recording(scored)
    status, text = post(client, path, body)
    assert status == 400, text
    assert json.loads(text)["error"]["param"] == param
    assert client.calls == []
