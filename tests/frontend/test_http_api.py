"""Every HTTP body field honoured or refused, through the `openai` client against a real
group on `tiny` (one group and gateway for the module): refusals are 400s naming the field,
n choices equal Client.generate with seed + i, echo, usage in streams only when asked,
logprobs equal the engine's, priority from the body or the header, /tokenize and
/detokenize, and the `tl` metrics. tests/frontend/test_http_api_shapes.py checks the reply shapes
without an engine.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import openai
import pytest

from tests.frontend import test_http
from tests.frontend.test_http import CHATML, http

gateway, oai, engine = test_http.gateway, test_http.oai, test_http.engine  # shared fixtures

MESSAGES = [{"role": "user", "content": "Hi"}]
TL_KEYS = {"queue_ms", "ttft_ms", "e2e_ms", "preemptions", "priority", "cached_tokens", "log",
           "log_id", "draft_tokens", "accepted_tokens"}


@pytest.fixture(scope="module")
def hf(engine):
    """The served tokenizer's backend: what `AutoTokenizer(...)(text)` runs, without the
    seconds transformers takes to import."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(Path(engine.stats()["tokenizer"]) / "tokenizer.json"))


def ids(hf, text: str, special: bool = True) -> list[int]:
    return hf.encode(text, add_special_tokens=special).ids


def complete(oai, **kw):
    return oai.completions.create(model="tiny", **{"prompt": "Hello", "max_tokens": 4, **kw})


def chat(oai, **kw):
    return oai.chat.completions.create(model="tiny", messages=MESSAGES,
                                       **{"max_tokens": 4, **kw})


# ------------------------------------------------------------------ refused fields

REFUSED_COMPLETION = [
    ("best_of", {"best_of": 2}), ("logit_bias", {"logit_bias": {"5": 1}}),
    ("suffix", {"suffix": "end"}), ("prompt_logprobs", {"extra_body": {"prompt_logprobs": 21}}),
    ("tempreature", {"extra_body": {"tempreature": 0.5}}),
    ("top_logprobs", {"extra_body": {"top_logprobs": 2}}),
    ("messages", {"extra_body": {"messages": MESSAGES}}),
    ("stream_options", {"stream_options": {"include_usage": True}}),
    ("stream_options", {"stream": True, "stream_options": {"include_usage": True, "x": 1}}),
    ("n", {"n": 17}), ("logprobs", {"logprobs": 21}), ("seed", {"seed": "7"}),
    ("min_p", {"extra_body": {"min_p": 1.5}}), ("presence_penalty", {"presence_penalty": 2.5}),
    ("frequency_penalty", {"frequency_penalty": "x"}),
    ("repetition_penalty", {"extra_body": {"repetition_penalty": 0}}),
    ("min_tokens", {"max_tokens": 2, "extra_body": {"min_tokens": 3}}),
    ("stop_token_ids", {"extra_body": {"stop_token_ids": ["a"]}}),
    ("include_stop_str_in_output", {"extra_body": {"include_stop_str_in_output": 1}}),
    ("skip_special_tokens", {"extra_body": {"skip_special_tokens": "no"}}),
    ("ignore_eos", {"extra_body": {"ignore_eos": 0}}), ("top_k", {"extra_body": {"top_k": 1.5}}),
    ("add_special_tokens", {"extra_body": {"add_special_tokens": "yes"}}),
    ("user", {"user": "u" * 300}), ("priority", {"extra_body": {"priority": 1001}}),
]
REFUSED_CHAT = [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
    ("functions", {"functions": [{"name": "f"}]}), ("tool_choice", {"tool_choice": "auto"}),
    ("function_call", {"function_call": "auto"}),
    ("response_format", {"response_format": {"type": "json_schema"}}),
    ("parallel_tool_calls", {"extra_body": {"parallel_tool_calls": "yes"}}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}),
    ("store", {"store": True}), ("metadata", {"metadata": {"k": "v"}}),
    ("service_tier", {"service_tier": "flex"}), ("reasoning_effort", {"reasoning_effort": "low"}),
    ("web_search_options", {"web_search_options": {}}), ("verbosity", {"verbosity": "high"}),
    ("logit_bias", {"logit_bias": {"5": -100}}), ("top_logprobs", {"top_logprobs": 2}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}),
    ("logprobs", {"extra_body": {"logprobs": 2}}),
    ("max_completion_tokens", {"max_completion_tokens": 5, "max_tokens": 6}),
    ("echo", {"extra_body": {"echo": True}}), ("best_of", {"extra_body": {"best_of": 1}}),
    ("n", {"n": 0}),
]


@pytest.mark.parametrize("call,param,kw", [(complete, *r) for r in REFUSED_COMPLETION]
                         + [(chat, *r) for r in REFUSED_CHAT],
                         ids=[r[0] for r in REFUSED_COMPLETION]
                         + [f"chat-{r[0]}" for r in REFUSED_CHAT])
def test_refused_fields_get_400_naming_them(oai, call, param, kw):
    with pytest.raises(openai.BadRequestError) as e:
        call(oai, **kw)
    assert e.value.param == param, e.value.body
    assert e.value.body["message"]


def test_neutral_values_are_accepted(oai):
    r = complete(oai, best_of=1, logit_bias={}, suffix="", echo=False, max_tokens=1,
                 extra_body={"top_k": -1, "stream_options": None})
    assert r.choices[0].finish_reason
    r = chat(oai, tools=[], tool_choice="none", response_format={"type": "text"},
             parallel_tool_calls=True, store=False, metadata={}, service_tier="auto",
             modalities=["text"], verbosity="medium", logit_bias={}, prompt_cache_key="k",
             safety_identifier="s", max_tokens=1, extra_body={"function_call": "none"})
    assert r.choices[0].finish_reason


# ------------------------------------------------------------------ honoured fields


def test_n_siblings_share_the_prompts_blocks(oai):
    prompt = "A long shared prompt for every sibling choice, with more words. " * 2
    r = complete(oai, prompt=prompt, max_tokens=4, temperature=0.8, seed=3, n=3)
    n = r.usage.prompt_tokens
    cached = [c.model_extra["tl"]["cached_tokens"] for c in r.choices]
    assert cached[1] == cached[2] == (n - 1) // 16 * 16 > 0    # all but the last block
    assert r.usage.prompt_tokens_details.cached_tokens == cached[0]


def test_n_choices_equal_client_generate_with_seed_plus_i(oai, engine):
    case = {"prompt": "many", "max_tokens": 6, "temperature": 1.0}
    results = [engine.generate(**case, seed=11 + i) for i in range(3)]
    want = [r.text for r in results]
    got = complete(oai, **case, n=3, seed=11)
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert [c.text for c in got.choices] == want and len(set(want)) > 1
    assert got.usage.completion_tokens == sum(len(r.token_ids) for r in results)
    assert got.usage.prompt_tokens == len(results[0].prompt_token_ids)

    *chunks, last = complete(oai, **case, n=3, seed=11, stream=True,
                             stream_options={"include_usage": True})
    texts = ["", "", ""]
    for c in chunks:
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == want and last.usage == got.usage

    greedy = complete(oai, prompt="same", max_tokens=6, temperature=0, n=3)
    assert len({c.text for c in greedy.choices}) == 1
    seeded = chat(oai, n=2, seed=5, temperature=1.0, max_tokens=6)
    assert [c.index for c in seeded.choices] == [0, 1]


def test_sampling_extras_equal_client_generate(oai, engine):
    extras = {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3, "min_tokens": 3,
              "stop_token_ids": [101], "include_stop_str_in_output": True,
              "skip_special_tokens": False}
    case = {"prompt": "extras", "max_tokens": 8, "temperature": 0.8, "seed": 3, "stop": "e",
            "presence_penalty": 0.5, "frequency_penalty": 0.3}
    want = engine.generate(**case, **extras, user="u1")
    got = complete(oai, **case, user="u1", extra_body=extras)
    assert got.choices[0].text == want.text
    assert got.usage.completion_tokens == len(want.token_ids)


def test_echo_prepends_the_prompt(oai, engine, hf):
    want = engine.generate("Hello", max_tokens=4)
    assert complete(oai, echo=True, temperature=0).choices[0].text == "Hello" + want.text
    got = complete(oai, prompt=ids(hf, "Hi there"), echo=True, temperature=0)
    assert got.choices[0].text.startswith("Hi there")
    first = next(iter(complete(oai, echo=True, temperature=0, stream=True)))
    assert first.choices[0].text.startswith("Hello")


def test_usage_in_a_stream_only_when_asked(oai):
    chunks = list(complete(oai, stream=True))
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    *chunks, last = chat(oai, stream=True, stream_options={"include_usage": True})
    assert all(c.usage is None for c in chunks)
    assert last.choices == [] and last.usage.completion_tokens >= 1


def test_chat_prompt_is_the_template_without_added_special_tokens(oai, hf):
    text = CHATML.format("user", "Hi") + "<|im_start|>assistant\n"
    r = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=1)
    assert r.usage.prompt_tokens == len(ids(hf, text, special=False))


# ------------------------------------------------------------------ needs the engine side


def test_completion_logprobs_equal_the_engine(oai, engine):
    want = engine.generate("Hello", max_tokens=4, logprobs=2)
    got = complete(oai, temperature=0, logprobs=2).choices[0].logprobs
    assert got.token_logprobs == pytest.approx(want.logprobs, rel=1e-6)
    assert len(got.tokens) == len(want.token_ids) == len(got.text_offset)
    assert all(len(top) <= 2 for top in got.top_logprobs)
    streamed = [c.choices[0].logprobs for c in complete(oai, temperature=0, logprobs=2,
                                                        stream=True)]
    assert sum((lp.tokens for lp in streamed), []) == got.tokens
    assert sum((lp.text_offset for lp in streamed), []) == got.text_offset


def test_chat_logprobs_equal_the_engine(oai, engine):
    prompt = CHATML.format("user", "Hi") + "<|im_start|>assistant\n"
    want = engine.generate(prompt, max_tokens=4, logprobs=3, add_special_tokens=False)
    got = chat(oai, temperature=0, logprobs=True, top_logprobs=3).choices[0].logprobs
    assert [t.logprob for t in got.content] == pytest.approx(want.logprobs, rel=1e-6)
    for t, top in zip(got.content, want.top_logprobs):
        assert len(t.top_logprobs) == len(top) == 3
        assert t.bytes == list(t.token.encode())


def test_tl_carries_the_request_metrics(oai):
    r = complete(oai, extra_headers={"X-TL-Priority": "3"})
    assert set(r.model_extra["tl"]) == TL_KEYS and r.model_extra["tl"]["priority"] == 3
    r = chat(oai, n=2)
    assert all(set(c.model_extra["tl"]) == TL_KEYS for c in r.choices)
    last = list(complete(oai, stream=True))[-1]
    assert set(last.model_extra["tl"]) == TL_KEYS


# ------------------------------------------------------------------ priority, tokenize


def logged_priority(log, request_id: str) -> int:
    """The priority the step log recorded for the request (its writer lags a little)."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(f"file:{log}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT priority FROM requests WHERE client_request_id = ?",
                               (request_id,)).fetchone()
        if row or time.monotonic() > deadline:
            return row and row[0]
        time.sleep(0.05)


def test_priority_from_the_body_and_the_header_wins(oai, group):
    body = complete(oai, max_tokens=1, extra_body={"priority": 7})
    both = complete(oai, max_tokens=1, extra_body={"priority": 7},
                    extra_headers={"X-TL-Priority": "-9"})
    assert logged_priority(group.log, body.id.removeprefix("cmpl-")) == 7
    assert logged_priority(group.log, both.id.removeprefix("cmpl-")) == -9


def test_tokenize_is_the_engines_and_detokenize_inverts_it(gateway, engine, hf):
    status, _, r = http("POST", gateway + "/tokenize", {"model": "tiny", "prompt": "Hello"})
    assert status == 200, r
    assert r["tokens"] == ids(hf, "Hello") == engine.generate("Hello",
                                                              max_tokens=1).prompt_token_ids
    assert (r["count"], r["max_model_len"], r["token_strs"]) == (
        len(r["tokens"]), engine.stats()["max_model_len"], None)
    text = "Hello, wörld <|im_end|>"
    _, _, r = http("POST", gateway + "/tokenize", {"prompt": text, "return_token_strs": True})
    assert r["token_strs"] == [hf.id_to_token(t) for t in r["tokens"]]
    _, _, back = http("POST", gateway + "/detokenize", {"model": "tiny", "tokens": r["tokens"]})
    assert back == {"prompt": text}

    _, _, r = http("POST", gateway + "/tokenize", {"messages": MESSAGES})
    chatml = CHATML.format("user", "Hi") + "<|im_start|>assistant\n"
    assert r["tokens"] == ids(hf, chatml, special=False)


@pytest.mark.parametrize("path,body,param", [
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "x"}, "tokens"),
    ("/tokenize", {"prompt": "x", "text": "y"}, "text"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "prompt"),
], ids=["out of vocabulary", "not ids", "unknown field", "prompt and messages"])
def test_tokenize_refusals(gateway, path, body, param):
    status, _, r = http("POST", gateway + path, body)
    assert status == 400 and r["error"]["param"] == param, r
