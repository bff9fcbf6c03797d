"""What eval and load tools send the gateway (lm-eval, guidellm, the openai SDK), against a
real group on `tiny` with its gateway (scripts/serve --http-port 0, one group for the
module): batched prompts on /v1/completions, stream_options.continuous_usage_stats,
GET /tokenizer_info, a 400 for an explicit max_tokens past the context, a `param` on every
400, and /metrics' step histogram fed by every step. The batch's request mapping is also
checked in-process against a recording stand-in for the AsyncClient.
"""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.step_times import StepTimes, merge_snapshots
from frontend.client import ClientError
from tests.frontend import test_http
from tests.frontend.test_http import BAD, assert_openai_error, http, sse_events, wait_idle
from tests.frontend.test_http_api_shapes import completion

MAX_MODEL_LEN = 64
GROUP_ARGS = ["--http-port", "0", "--max-model-len", str(MAX_MODEL_LEN)]
EOS = "<|endoftext|>"


oai, engine = test_http.oai, test_http.engine   # shared fixtures, over this gateway


@pytest.fixture(scope="module")
def gateway(group) -> str:
    return group.http


def post_json(gateway: str, path: str, body: dict) -> tuple[int, dict | list | str]:
    status, _, reply = http("POST", gateway + path, body)
    if isinstance(reply, str) and reply.startswith("data: "):
        return status, sse_events(reply)
    return status, reply


# ------------------------------------------------------------------ batched prompts


def test_a_batch_of_strings_equals_one_request_per_prompt(oai, engine):
    prompts = ["Hello", "a longer prompt here", "x"]
    got = oai.completions.create(model="tiny", prompt=prompts, max_tokens=6, temperature=0)
    want = [engine.generate(p, max_tokens=6) for p in prompts]
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert [c.text for c in got.choices] == [w.text for w in want]
    assert [c.finish_reason for c in got.choices] == [w.finish_reason for w in want]
    assert got.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in want)
    assert got.usage.completion_tokens == sum(len(w.token_ids) for w in want)


def test_a_batch_of_token_lists_with_n_indexes_prompt_times_n_plus_sample(oai, engine):
    prompts = [[5, 17, 99], [200, 3], [7, 7, 7, 7]]
    got = oai.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=5,
                                 temperature=0.9, seed=11)
    assert [c.index for c in got.choices] == list(range(6))
    for c in got.choices:
        p, j = divmod(c.index, 2)
        want = engine.generate(prompts[p], max_tokens=5, temperature=0.9, seed=11 + j)
        assert c.text == want.text, (c.index, c.text, want.text)
    # a prompt's samples do not depend on its place in the batch
    alone = oai.completions.create(model="tiny", prompt=prompts[2], n=2, max_tokens=5,
                                   temperature=0.9, seed=11)
    assert [c.text for c in alone.choices] == [c.text for c in got.choices[4:]]
    assert got.usage.prompt_tokens == 3 + 2 + 4   # each prompt once, not once per sample


def test_a_streamed_batch_equals_the_whole_reply(oai, gateway):
    body = {"prompt": [[3, 1, 4], [1, 5], [9, 8, 7]], "max_tokens": 5, "temperature": 0,
            "n": 2}
    status, whole = post_json(gateway, "/v1/completions", body)
    assert status == 200, whole
    status, events = post_json(gateway, "/v1/completions",
                               {**body, "stream": True,
                                "stream_options": {"include_usage": True}})
    assert status == 200, events
    texts: dict[int, str] = {}
    finishes = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        if c["finish_reason"]:
            finishes[c["index"]] = c["finish_reason"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert finishes == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]


def test_a_batch_of_one_and_a_bare_prompt_agree(oai):
    for one in (["Hello"], [[5, 17, 99]]):
        batch = oai.completions.create(model="tiny", prompt=one, max_tokens=4, temperature=0)
        bare = oai.completions.create(model="tiny", prompt=one[0], max_tokens=4, temperature=0)
        assert batch.choices[0].text == bare.choices[0].text
        assert batch.usage == bare.usage


BAD_BATCHES = [
    ("257 prompts", {"prompt": ["x"] * 257}, "prompt"),
    ("20 prompts x n=16", {"prompt": ["x"] * 20, "n": 16}, "n"),
    ("mixed kinds", {"prompt": ["x", [1, 2]]}, "prompt"),
    ("an empty list", {"prompt": []}, "prompt"),
    ("an empty token list", {"prompt": [[1], []]}, "prompt"),
    ("a list of numbers and lists", {"prompt": [1, [2]]}, "prompt"),
    ("an empty string in a batch", {"prompt": ["x", ""]}, "prompt"),
    ("a token outside the vocabulary in a batch", {"prompt": [[1], [10 ** 9]]}, "prompt"),
]


@pytest.mark.parametrize("body,param", [b[1:] for b in BAD_BATCHES],
                         ids=[b[0] for b in BAD_BATCHES])
def test_bad_batches_get_400_naming_the_field(gateway, body, param):
    status, reply = post_json(gateway, "/v1/completions", {"max_tokens": 2, **body})
    assert status == 400, reply
    assert_openai_error(reply, 400)
    assert reply["error"]["param"] == param, reply


def test_a_batch_maps_choices_to_prompts_ids_and_seeds():
    """In-process: choice i is prompt i // n's sample i % n, ids <id>-<i>, seed + i % n."""
    client, body = completion({"prompt": ["p", "q"], "n": 2, "seed": 5})
    rid = body["id"].removeprefix("cmpl-")
    calls = sorted(client.calls, key=lambda c: c["request_id"])   # leaders start first
    assert [(c["prompt"], c["request_id"], c["seed"]) for c in calls] == [
        ("p", f"{rid}-0", 5), ("p", f"{rid}-1", 6), ("q", f"{rid}-2", 5), ("q", f"{rid}-3", 6)]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["tl"]["log_id"] for c in body["choices"]] == [f"{rid}-{i}" for i in range(4)]
    # two_tokens' first delta says 2 prompt tokens: counted once per prompt
    assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 8
    client, body = completion({"prompt": [[3], [4, 4]], "echo": True})
    assert [c["text"] for c in body["choices"]] == ["<3>ab", "<4><4>ab"]


def test_a_prompts_siblings_wait_for_its_first_choice_only():
    """Each prompt's first choice starts at once (prefill in parallel); its siblings once
    it has a token (they then hit its prefix-cache blocks)."""
    client, _ = completion({"prompt": ["a", "b"], "n": 2})
    started = [c["request_id"][-1] for c in client.calls]
    assert started[:2] == ["0", "2"], started   # before: 0, then 1, 2, 3 after its token


# ------------------------------------------------------------------ continuous usage


def test_continuous_usage_stats_put_usage_on_every_chunk(gateway):
    body = {"prompt": ["count", "me too"], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, events = post_json(gateway, "/v1/completions", body)
    assert status == 200, events
    assert all("usage" in e for e in events), events
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 12
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"]
               + e["usage"]["completion_tokens"] for e in events)
    assert events[-1]["choices"] == [] and events[-2]["choices"]   # the usage chunk still ends it
    # without include_usage: usage on every chunk, no usage-only chunk
    body["stream_options"] = {"continuous_usage_stats": True}
    status, events = post_json(gateway, "/v1/completions", body)
    assert all("usage" in e and e["choices"] for e in events), events
    # as guidellm sends it, on chat too: the role chunks carry the prompt's usage
    status, events = post_json(gateway, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert status == 200 and all("usage" in e for e in events), events
    assert events[0]["usage"]["completion_tokens"] == 0 and events[0]["usage"]["prompt_tokens"]


def test_continuous_usage_stats_is_a_boolean_and_only_with_stream(gateway):
    for body in ({"stream": True, "stream_options": {"continuous_usage_stats": "yes"}},
                 {"stream_options": {"continuous_usage_stats": True}}):
        status, reply = post_json(gateway, "/v1/completions", {"prompt": "x", **body})
        assert status == 400 and reply["error"]["param"] == "stream_options", reply


# ------------------------------------------------------------------ /tokenizer_info


def test_tokenizer_info_has_vllms_shape_and_what_lm_eval_reads(gateway):
    status, _, info = http("GET", gateway + "/tokenizer_info")
    assert status == 200, info
    assert info["tokenizer_class"] and isinstance(info["tokenizer_class"], str)
    assert info["eos_token"] == EOS and info["pad_token"] == EOS and "bos_token" in info
    assert "<|im_start|>" in info["chat_template"]
    assert "vocab_file" not in info and "merges_file" not in info
    # lm-eval's remote tokenizer: eos_token_id = /tokenize(eos_token, no specials)[0]
    status, _, tok = http("POST", gateway + "/tokenize",
                          {"prompt": info["eos_token"], "add_special_tokens": False})
    assert status == 200 and tok["tokens"] == [256], tok


# ------------------------------------------------------------------ the context and params


def test_an_explicit_max_tokens_past_the_context_is_a_400(gateway, engine, oai):
    assert engine.stats()["max_model_len"] == MAX_MODEL_LEN
    prompt = list(range(1, MAX_MODEL_LEN - 3))   # 60 tokens
    for body in ({"prompt": prompt, "max_tokens": 5},
                 {"prompt": [[1, 2], prompt], "max_tokens": 5}):
        status, reply = post_json(gateway, "/v1/completions", body)
        assert status == 400, reply
        assert reply["error"]["param"] == "max_tokens", reply
        assert str(MAX_MODEL_LEN) in reply["error"]["message"]
    fits = oai.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert (fits.choices[0].finish_reason, fits.usage.completion_tokens) == ("length", 4)
    # no max_tokens (OpenAI's 16): cut at the context, as before
    cut = oai.completions.create(model="tiny", prompt=prompt, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 4)
    # chat names the field the body used
    long_chat = [{"role": "user", "content": "y" * 40}]
    for name in ("max_completion_tokens", "max_tokens"):
        status, reply = post_json(gateway, "/v1/chat/completions",
                                  {"messages": long_chat, name: 30})
        assert (status, reply["error"]["param"]) == (400, name), reply
    status, reply = post_json(gateway, "/v1/chat/completions", {"messages": long_chat})
    assert status == 200 and reply["choices"][0]["finish_reason"] in ("length", "stop")


def test_the_client_refuses_only_when_asked(engine):
    prompt = list(range(1, MAX_MODEL_LEN - 3))
    r = engine.generate(prompt, max_tokens=5, ignore_eos=True)
    assert (r.finish_reason, len(r.token_ids)) == ("length", 4)
    with pytest.raises(ClientError) as e:
        engine.generate(prompt, max_tokens=5, max_tokens_must_fit=True)
    assert (e.value.code, e.value.param) == (400, "max_tokens")
    assert engine.generate(prompt, max_tokens=4, max_tokens_must_fit=True).token_ids


ENGINE_400S = [
    ("a prompt of max_model_len tokens", {"prompt": [1] * MAX_MODEL_LEN}, "prompt"),
    ("a token outside the vocabulary", {"prompt": [10 ** 9]}, "prompt"),
    ("an empty prompt", {"prompt": ""}, "prompt"),
    ("top_k past the vocabulary", {"prompt": "x", "top_k": 10 ** 8}, "top_k"),
    ("a stop token id past the vocabulary", {"prompt": "x", "stop_token_ids": [10 ** 8]},
     "stop_token_ids"),
]


@pytest.mark.parametrize("body,param", [b[1:] for b in ENGINE_400S],
                         ids=[b[0] for b in ENGINE_400S])
def test_the_engines_400s_name_their_param(gateway, body, param):
    """The frontend's checks (what only the model knows) come back with the field."""
    status, reply = post_json(gateway, "/v1/completions", {"max_tokens": 2, **body})
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply


@pytest.mark.parametrize("body,headers", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_every_400_names_a_param(gateway, body, headers):
    status, _, reply = http("POST", gateway + "/v1/completions", body, headers)
    assert status == 400, reply
    assert isinstance(reply["error"]["param"], str), reply


# ------------------------------------------------------------------ metrics


def scrape(gateway: str) -> dict:
    """name -> family, from /metrics."""
    status, _, text = http("GET", gateway + "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, name: str, **labels) -> float:
    return next(s.value for s in fams[family].samples
                if s.name == name and s.labels == {k: str(v) for k, v in labels.items()})


def test_the_step_histogram_counts_every_step(gateway, group, oai, engine):
    wait_idle(group.address)
    before_steps = engine.stats()["steps"]
    before = scrape(gateway)
    oai.completions.create(model="tiny", prompt=["a", "bc"], max_tokens=7, temperature=0,
                           extra_body={"ignore_eos": True})
    wait_idle(group.address)
    after = scrape(gateway)
    steps = engine.stats()["steps"] - before_steps
    assert steps >= 7
    count = "tl_step_duration_seconds_count"
    moved = (sample(after, "tl_step_duration_seconds", count)
             - sample(before, "tl_step_duration_seconds", count))
    assert moved == steps      # one scrape saw N steps: count N (it was 1 per scrape)
    buckets = [s for s in after["tl_step_duration_seconds"].samples
               if s.name.endswith("_bucket")]
    values = [s.value for s in buckets]
    assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf"
    assert values[-1] == sample(after, "tl_step_duration_seconds", count)
    assert sample(after, "tl_step_duration_seconds", "tl_step_duration_seconds_sum") > 0


def test_no_gauge_ends_in_total(gateway):
    fams = scrape(gateway)
    gauges = [name for name, f in fams.items() if f.type == "gauge"]
    assert "tl_kv_blocks_capacity" in gauges and "tl_replica_kv_blocks_capacity" in gauges
    assert not [g for g in gauges if g.endswith("_total")], gauges


def test_step_times_buckets_are_cumulative_and_bounds_inclusive():
    st = StepTimes((1, 10))
    for ms in (0.5, 1, 1.5, 10, 11, 500):
        st.observe(ms)
    snap = st.snapshot()
    assert snap["counts"] == [2, 4, 6] and snap["le_ms"] == [1, 10]
    assert snap["sum_ms"] == pytest.approx(524.0)
    merged = merge_snapshots([snap, StepTimes((1, 10)).snapshot(), snap])
    assert merged["counts"] == [4, 8, 12] and merged["sum_ms"] == pytest.approx(1048.0)
    assert merge_snapshots([snap, StepTimes((2, 10)).snapshot()]) is None
