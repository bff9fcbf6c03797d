"""Prompt logprobs at the gateway, in-process against a recording stand-in for the
AsyncClient (tests/frontend/test_http_api_shapes.py's): echo with logprobs in OpenAI's
legacy shape, max_tokens 0 with echo, prompt_logprobs in vLLM's shape on both routes, each
choice of a batch of prompts with its own prompt's, and the 400s.
tests/group/test_prompt_logprobs_api.py checks the same against the real engine."""
from __future__ import annotations

import json

import pytest

from core.ipc.protocol import Delta
from tests.frontend.test_http_api_shapes import Recording, chat, completion, post

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


# ------------------------------------------------------------------ a batch of prompts


def own_prompt(kw: dict) -> list:
    """As scored, on the request's own prompt (token ids): position p scores token t with
    logprob -t / 10, rank t, and alternatives [t + 100, t + 200] best first."""
    ids = kw["prompt"]
    deltas = scored({**kw, "prompt_logprobs": None})
    deltas[0].prompt_token_ids = list(ids)
    if kw["prompt_logprobs"] is not None:
        deltas[0].prompt_logprobs = [None] + [
            [-t / 10, t, [[t + 100, -0.01], [t + 200, -0.02]][:kw["prompt_logprobs"]]]
            for t in ids[1:]]
    return deltas


def echo_expected(ids: list[int]) -> dict:
    return {"tokens": [f"<{t}>" for t in ids] + ["<1>", "<2>"],
            "token_logprobs": [None] + [-t / 10 for t in ids[1:]] + [-0.5, -0.25],
            "top_logprobs": [None] + [{f"<{t + 100}>": -0.01} for t in ids[1:]]
            + [{"<1>": -0.5, "<2>": -1.0}, {"<2>": -0.25, "<1>": -1.0}]}  # the stand-in's


def test_echo_with_logprobs_over_a_batch_gives_each_choice_its_own_prompt():
    prompts = [[7, 8, 9], [4, 5]]
    client, body = completion({"echo": True, "logprobs": 1, "prompt": prompts, "n": 2},
                              Recording(own_prompt))
    by_choice = sorted(client.calls, key=lambda c: int(c["request_id"].rsplit("-", 1)[1]))
    assert [c["prompt"] for c in by_choice] == [prompts[0]] * 2 + [prompts[1]] * 2
    for i, choice in enumerate(body["choices"]):
        ids = prompts[i // 2]
        assert choice["index"] == i
        assert choice["text"] == "".join(f"<{t}>" for t in ids) + "ab"
        lp = choice["logprobs"]
        assert {k: lp[k] for k in echo_expected(ids)} == echo_expected(ids)
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 8


def test_echo_with_logprobs_streams_each_choices_own_prompt_first():
    prompts = [[7, 8, 9], [4, 5]]
    _, events = completion({"echo": True, "logprobs": 1, "prompt": prompts, "stream": True},
                           Recording(own_prompt))
    firsts = {}
    for e in events:
        for c in e["choices"]:
            firsts.setdefault(c["index"], c)
    for i, ids in enumerate(prompts):
        assert firsts[i]["text"] == "".join(f"<{t}>" for t in ids) + "a"
        assert firsts[i]["logprobs"]["tokens"] == [f"<{t}>" for t in ids] + ["<1>"]
        assert firsts[i]["logprobs"]["token_logprobs"][:len(ids)] == echo_expected(ids)[
            "token_logprobs"][:len(ids)]


def test_prompt_logprobs_over_a_batch_gives_each_choice_its_own_prompt():
    prompts = [[7, 8, 9], [4, 5]]
    client, body = completion({"prompt_logprobs": 2, "prompt": prompts},
                              Recording(own_prompt))
    assert [c["prompt_logprobs"] for c in client.calls] == [2, 2]
    for choice, ids in zip(body["choices"], prompts):
        assert choice["text"] == "ab"
        assert choice["prompt_logprobs"] == [None] + [
            {str(t + 100): {"logprob": -0.01, "rank": 1, "decoded_token": f"<{t + 100}>"},
             str(t + 200): {"logprob": -0.02, "rank": 2, "decoded_token": f"<{t + 200}>"},
             str(t): {"logprob": -t / 10, "rank": t, "decoded_token": f"<{t}>"}}
            for t in ids[1:]]


def test_max_tokens_0_over_a_batch_with_continuous_usage_counts_no_completion():
    """The echoed prompts are prompt tokens, never completion tokens, on every chunk; and
    max_tokens 0 always fits: the engine request does not ask it to."""
    prompts = [[7, 8, 9], [4, 5]]
    client, events = completion({"echo": True, "logprobs": 0, "max_tokens": 0, "stream": True,
                                 "prompt": prompts,
                                 "stream_options": {"continuous_usage_stats": True}},
                                Recording(own_prompt))
    assert [c["max_tokens_must_fit"] for c in client.calls] == [False, False]
    assert [c["max_tokens"] for c in client.calls] == [1, 1]
    assert events and all(e["usage"] == {"prompt_tokens": 5, "completion_tokens": 0,
                                         "total_tokens": 5,
                                         "prompt_tokens_details": {"cached_tokens": 0}}
                          for e in events)
    texts = {}
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: "<7><8><9>", 1: "<4><5>"}
    client, _ = completion({"echo": True, "max_tokens": 3, "prompt": prompts},
                           Recording(own_prompt))
    assert [c["max_tokens_must_fit"] for c in client.calls] == [True, True]


class Counted(Recording):
    """A counted client, as the gateway's pool.UserClient: the choices held at once."""

    def __init__(self, script):
        super().__init__(script)
        self.held = []

    def hold(self, count: int) -> None:
        self.held.append(count)

    def release(self) -> None:
        self.held.append(0)


def test_max_tokens_0_choices_count_toward_the_per_user_cap():
    client = Counted(own_prompt)
    completion({"echo": True, "max_tokens": 0, "prompt": [[7, 8], [4, 5]], "n": 2}, client)
    assert client.held == [4, 0]
