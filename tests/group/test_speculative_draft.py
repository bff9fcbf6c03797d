"""Speculative decoding with a draft model end to end (worker/draft.py): a group serving the
echo model with `--speculative draft:ECHO2` (an echo model with other layers). Each request
is sent with speculation and opted out: tokens, logprobs and stop strings agree, drafts are
accepted and rejected, and the step log verifies with the models (the draft model re-drafts
every step: its drafts are checked against the log's) and without them at teardown."""
from __future__ import annotations

import pytest

from frontend.client import Client
from tests.checkpoints import echo_checkpoint
from tests.conftest import serving


@pytest.fixture(scope="module")
def draft_group(tmp_path_factory):
    model = echo_checkpoint(tmp_path_factory)
    draft = echo_checkpoint(tmp_path_factory, "echo-draft", 11)
    yield from serving(tmp_path_factory.mktemp("draft"),
                       ["--model", str(model), "--speculative", f"draft:{draft}",
                        "--num-draft", "4", "--num-blocks", "128"],
                       verify=((), ("--with-model",)))


@pytest.fixture(scope="module")
def client(draft_group):
    with Client(draft_group.address, timeout=120) as c:
        yield c


PROMPTS = ["abcdefg " * 4, "the cat sat on the mat; the cat sat on the", "xyz" * 9]


@pytest.mark.parametrize("temperature", [0.0, 8.0])
def test_a_draft_model_gives_the_tokens_and_logprobs_of_plain_decoding(client, temperature):
    drafted = accepted = 0
    for i, prompt in enumerate(PROMPTS):
        kw = dict(max_tokens=24, temperature=temperature, seed=i, ignore_eos=True, logprobs=1)
        on = client.generate(prompt, **kw)
        off = client.generate(prompt, speculative=False, **kw)
        assert on.token_ids == off.token_ids and on.text == off.text
        assert on.logprobs == off.logprobs and on.top_logprobs == off.top_logprobs
        assert off.metrics["draft_tokens"] == 0
        drafted += on.metrics["draft_tokens"]
        accepted += on.metrics["accepted_tokens"]
    assert 0 < accepted <= drafted


def test_a_stop_string_ends_a_drafted_request_where_plain_decoding_does(client):
    kw = dict(max_tokens=30, temperature=8.0, seed=3, ignore_eos=True)
    plain = client.generate("hello world " * 3, speculative=False, **kw).text
    on = client.generate("hello world " * 3, stop=plain[10:12], **kw)
    off = client.generate("hello world " * 3, stop=plain[10:12], speculative=False, **kw)
    assert on.finish_reason == off.finish_reason == "stop"
    assert on.text == off.text and on.token_ids == off.token_ids
    assert client.stats()["draft_tokens"] > 0
