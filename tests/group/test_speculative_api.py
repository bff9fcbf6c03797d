"""Speculative decoding end to end (docs/design/scheduler.md, "Speculative decoding"): a group serving
the echo model with `--speculative ngram`. Requests that opt out (`speculative=False`) are
plain decoding inside the same engine, so each request is sent both ways: tokens, logprobs,
finish and stop strings must agree, drafts must be accepted, the metrics, stats() and
/metrics report them, and the step log verifies with and without the model at teardown.
A draft model that cannot be had is refused at start (tests/group/test_speculative_draft.py
serves one)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from frontend.client import Client
from tests.checkpoints import echo_checkpoint
from tests.conftest import serving
from tests.frontend.test_http import http


@pytest.fixture(scope="module")
def spec_group(tmp_path_factory):
    model = echo_checkpoint(tmp_path_factory)
    yield from serving(tmp_path_factory.mktemp("spec"),
                       ["--model", str(model), "--speculative", "ngram", "--num-draft", "4",
                        "--http-port", "0", "--num-blocks", "128"],
                       verify=((), ("--with-model",)))


@pytest.fixture(scope="module")
def client(spec_group):
    with Client(spec_group.address, timeout=120) as c:
        yield c


PROMPTS = ["abcdefg " * 4, "the cat sat on the mat; the cat sat on the", "xyz" * 9,
           "0123456789" * 2]


def both_ways(client, prompt, **kw):
    on = client.generate(prompt, ignore_eos=True, logprobs=1, **kw)
    off = client.generate(prompt, ignore_eos=True, logprobs=1, speculative=False, **kw)
    return on, off


@pytest.mark.parametrize("temperature", [0.0, 8.0])
def test_opting_out_gives_the_same_tokens_and_logprobs(client, temperature):
    accepted = 0
    for i, prompt in enumerate(PROMPTS):
        on, off = both_ways(client, prompt, max_tokens=24, temperature=temperature, seed=i)
        assert on.token_ids == off.token_ids and on.text == off.text
        assert on.logprobs == off.logprobs and on.top_logprobs == off.top_logprobs
        assert off.metrics["draft_tokens"] == off.metrics["accepted_tokens"] == 0
        assert on.metrics["draft_tokens"] >= on.metrics["accepted_tokens"]
        accepted += on.metrics["accepted_tokens"]
    assert accepted > 0


def test_stop_strings_end_a_speculative_request_where_plain_decoding_does(client):
    plain = client.generate("hello world " * 3, max_tokens=30, temperature=8.0, seed=3,
                            ignore_eos=True, speculative=False).text
    stop = plain[10:12]
    on, off = both_ways(client, "hello world " * 3, max_tokens=30, temperature=8.0, seed=3,
                        stop=stop)
    assert on.finish_reason == off.finish_reason == "stop"
    assert on.text == off.text and on.token_ids == off.token_ids


def test_a_stop_string_inside_a_step_of_several_tokens_ends_at_its_token(client):
    """Greedy, the echo model repeats the prompt's last byte and every draft is kept: after
    the prefill's token, a step of 5 (4 drafts of "z"), so the fourth token, completing the
    stop string, comes with two more."""
    on, off = both_ways(client, "xyz" * 6, max_tokens=40, stop="z" * 4)
    assert on.finish_reason == off.finish_reason == "stop"
    assert on.token_ids == off.token_ids and len(on.token_ids) == 4
    assert on.metrics["accepted_tokens"] > 0


def test_stats_and_metrics_report_drafts(spec_group, client):
    client.generate("abab" * 8, max_tokens=16, ignore_eos=True)
    st = client.stats()
    assert st["draft_tokens"] >= st["accepted_tokens"] > 0
    status, _, text = http("GET", f"{spec_group.http}/metrics")
    assert status == 200 and "tl_draft_tokens" in text and "tl_accepted_tokens" in text


def test_the_http_field_opts_out_and_is_validated(spec_group):
    body = {"prompt": "abcabcabcabc", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    url = f"{spec_group.http}/v1/completions"
    status, _, on = http("POST", url, body)
    status_off, _, off = http("POST", url, {**body, "speculative": False})
    assert status == status_off == 200
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert off["tl"]["draft_tokens"] == 0 and on["tl"]["draft_tokens"] > 0
    status, _, bad = http("POST", url, {**body, "speculative": "no"})
    assert status == 400 and bad["error"]["param"] == "speculative"


def test_a_draft_model_that_cannot_be_had_is_refused_at_start():
    r = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--model", "null",
                        "--no-log", "--speculative", "draft:/nowhere.gguf"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "/nowhere.gguf" in r.stderr
    r = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--model", "null",
                        "--no-log", "--speculative", "draft:null"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot draft" in r.stderr
