"""Prompt logprobs end to end on `tiny` (one group with its gateway for the module; 16-token
chunks split the prompts): the ZMQ client's Result.prompt_logprobs and the HTTP routes'
echo and prompt_logprobs equal transformers' log_softmax over the same prompt, in a batch
with other requests and for a prompt already cached; bad values are 400s naming the field;
the step log, prompt logprobs included, replays with the model."""
from __future__ import annotations

import asyncio
import random
import sqlite3

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from frontend.client import AsyncClient, Client, ClientError
from tests.conftest import snapshot_log, verify_log
from tests.frontend.test_http import http
from tests.waiting import wait_until
from worker.load import resolve_model

GROUP_ARGS = ["--http-port", "0", "--max-chunk", "16", "--max-batch-tokens", "48"]


@pytest.fixture(scope="module")
def stock():
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), attn_implementation="sdpa")


@pytest.fixture(scope="module")
def client(group):
    with Client(group.address, timeout=60) as c:
        yield c


def prompt_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def reference(stock, prompt) -> torch.Tensor:
    with torch.inference_mode():
        return stock(torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def assert_scores(stock, prompt, got: list, top: int) -> None:
    """got: Result.prompt_logprobs (None, then {id: logprob} per position)."""
    ref = reference(stock, prompt)
    assert len(got) == len(prompt) and got[0] is None
    for p in range(1, len(prompt)):
        want = ref[p - 1]
        assert prompt[p] in got[p]
        assert abs(got[p][prompt[p]] - float(want[prompt[p]])) < 1e-4, p
        best = want.topk(top).indices.tolist()
        assert len(set(got[p]) - {prompt[p]}) <= top and set(best) <= set(got[p])


def test_zmq_prompt_logprobs_in_a_batch_match_transformers(group, stock):
    mine = prompt_ids(45, 1)
    others = [prompt_ids(n, 10 + n) for n in (30, 12, 50)]

    async def run():
        async with AsyncClient(group.address, timeout=60) as c:
            calls = [c.generate(mine, max_tokens=3, prompt_logprobs=2, ignore_eos=True)]
            calls += [c.generate(o, max_tokens=6, ignore_eos=True) for o in others]
            calls += [c.generate(others[0], max_tokens=2, prompt_logprobs=0)]
            return await asyncio.gather(*calls)

    first, *rest, again = asyncio.run(run())
    assert_scores(stock, mine, first.prompt_logprobs, 2)
    assert all(r.prompt_logprobs is None for r in rest)
    assert_scores(stock, others[0], again.prompt_logprobs, 0)
    assert all(len(d) == 1 for d in again.prompt_logprobs[1:])


def test_a_cached_prompt_still_gets_every_position(client, stock):
    p = prompt_ids(70, 2)
    client.generate(p, max_tokens=2)
    assert client.generate(p, max_tokens=2).cached_tokens > 0   # it is cached
    r = client.generate(p, max_tokens=2, prompt_logprobs=1)
    assert r.cached_tokens == 0
    assert_scores(stock, p, r.prompt_logprobs, 1)


def test_the_stream_brings_them_with_ranks_on_its_first_delta(client, stock):
    p = prompt_ids(20, 3)
    deltas = list(client.stream(p, max_tokens=3, prompt_logprobs=1, ignore_eos=True))
    first = deltas[0].prompt_logprobs
    assert first[0] is None and all(d.prompt_logprobs is None for d in deltas[1:])
    ref = reference(stock, p)
    for pos, (lp, rank, alts) in enumerate(first[1:], 1):
        assert rank == int((ref[pos - 1] > ref[pos - 1][p[pos]]).sum()) + 1
        assert len(alts) == 1 and alts[0][0] == int(ref[pos - 1].argmax())


@pytest.mark.parametrize("kw, field", [
    (dict(prompt_logprobs=21), "prompt_logprobs"), (dict(prompt_logprobs=-1), "prompt_logprobs"),
])
def test_zmq_bad_values_are_400_naming_the_field(client, kw, field):
    with pytest.raises(ClientError) as e:
        client.generate([5, 6, 7], max_tokens=2, **kw)
    assert e.value.code == 400 and field in e.value.message


def test_a_prompt_past_the_context_is_400(client, group):
    limit = client.stats()["max_model_len"]
    with pytest.raises(ClientError) as e:
        client.generate(prompt_ids(limit, 4), max_tokens=1, prompt_logprobs=1)
    assert e.value.code == 400 and "max_model_len" in e.value.message
    status, _, body = http("POST", group.http + "/v1/completions",
                           {"prompt": prompt_ids(limit, 4), "echo": True, "logprobs": 1,
                            "max_tokens": 0})
    assert status == 400 and "max_model_len" in body["error"]["message"]


@pytest.fixture(scope="module")
def oai(group):
    with openai.OpenAI(base_url=group.http + "/v1", api_key="x", max_retries=0) as c:
        yield c


def test_http_echo_scores_the_prompt(oai, stock):
    p = prompt_ids(33, 5)
    r = oai.completions.create(model="tiny", prompt=p, echo=True, logprobs=2, max_tokens=0)
    (choice,) = r.choices
    lp = choice.logprobs
    assert r.usage.completion_tokens == 0 and choice.finish_reason == "length"
    assert len(lp.tokens) == len(p) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and len(lp.top_logprobs[1]) <= 2
    ref = reference(stock, p)
    for pos in range(1, len(p)):
        assert abs(lp.token_logprobs[pos] - float(ref[pos - 1][p[pos]])) < 1e-4
    r = oai.completions.create(model="tiny", prompt=p, echo=True, logprobs=0, max_tokens=3,
                               temperature=0, extra_body={"ignore_eos": True})
    (choice,) = r.choices
    assert len(choice.logprobs.tokens) == len(p) + 3 and choice.logprobs.token_logprobs[0] is None
    assert choice.text.startswith(choice.logprobs.tokens[0])


def test_http_prompt_logprobs_in_vllms_shape(oai, stock):
    p = prompt_ids(25, 6)
    r = oai.completions.create(model="tiny", prompt=p, max_tokens=2,
                               extra_body={"prompt_logprobs": 3})
    got = r.choices[0].model_extra["prompt_logprobs"]
    ref = reference(stock, p)
    assert len(got) == len(p) and got[0] is None
    for pos in range(1, len(p)):
        mine = got[pos][str(p[pos])]
        assert abs(mine["logprob"] - float(ref[pos - 1][p[pos]])) < 1e-4
        assert set(mine) == {"logprob", "rank", "decoded_token"}
    r = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                    max_tokens=2, extra_body={"prompt_logprobs": 1})
    got = r.model_extra["prompt_logprobs"]
    assert len(got) == r.usage.prompt_tokens and got[0] is None
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                    extra_body={"prompt_logprobs": 21})
    assert e.value.param == "prompt_logprobs"


def test_http_a_batch_of_two_prompts_scores_each_its_own(oai, stock):
    """echo with logprobs and prompt_logprobs over a batch: each choice's prompt entries are
    its own prompt's (choice i*n + j is prompt i's), max_tokens 0 included."""
    prompts = [prompt_ids(21, 7), prompt_ids(30, 8)]
    refs = [reference(stock, p) for p in prompts]
    r = oai.completions.create(model="tiny", prompt=prompts, echo=True, logprobs=1,
                               max_tokens=0, extra_body={"prompt_logprobs": 2})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == 51 and r.usage.completion_tokens == 0
    for choice, p, ref in zip(r.choices, prompts, refs):
        lp, got = choice.logprobs, choice.model_extra["prompt_logprobs"]
        assert len(lp.tokens) == len(p) == len(got) and lp.token_logprobs[0] is None
        for pos in range(1, len(p)):
            want = float(ref[pos - 1][p[pos]])
            assert abs(lp.token_logprobs[pos] - want) < 1e-4
            assert abs(got[pos][str(p[pos])]["logprob"] - want) < 1e-4
    r = oai.completions.create(model="tiny", prompt=prompts, echo=True, logprobs=0, n=2,
                               max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    for choice in r.choices:
        p = prompts[choice.index // 2]
        assert len(choice.logprobs.tokens) == len(p) + 2
        assert abs(choice.logprobs.token_logprobs[len(p) - 1]
                   - float(refs[choice.index // 2][len(p) - 2][p[-1]])) < 1e-4


def test_the_log_replays_with_the_model(group, tmp_path):
    """Last: every request above is in the log; its prompt logprobs are checked bit for bit."""
    def settled():
        with sqlite3.connect(f"file:{group.log}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM requests WHERE finish_reason IS NULL"
                                 ).fetchone()[0] == 0
    wait_until(settled, 10)
    snapshot = snapshot_log(group.log, tmp_path / "snapshot.db")
    with sqlite3.connect(snapshot) as conn:
        assert conn.execute("SELECT count(*) FROM prompt_logprobs").fetchone()[0] > 5
    r = verify_log(snapshot, "--with-model")
    assert r.returncode == 0, r.stdout + r.stderr
