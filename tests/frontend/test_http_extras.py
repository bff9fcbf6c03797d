"""Issue 52's smaller API items against a real group on `tiny`, started as users start it
(scripts/serve --http-port 0 --served-model-name ... --allowed-origins ...), with the
`openai` client: the served name in /v1/models and /v1/models/{id}, another name a 404,
/version, the guided_* aliases equal to structured_outputs, continue_final_message and
chat_template_kwargs reaching the template's render, CORS for the allowed origin only, and a
client that disconnects mid-stream counted as an abort. The unit tests are
test_http_vllm_fields.py and test_http_routes_extra.py."""
from __future__ import annotations

import asyncio
import re

import aiohttp
import openai
import pytest

from tests.frontend.test_http import http, wait_idle
from tests.frontend.test_http_metrics import moved, scrape
from tests.waiting import wait_until

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"   # a Hub id: a slash in the model's path
SITE = "https://app.example"
GROUP_ARGS = ["--http-port", "0", "--served-model-name", NAME, "--allowed-origins", SITE]
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def gateway(group) -> str:
    return group.http


@pytest.fixture(scope="module")
def oai(gateway):
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as c:
        yield c


def greedy(oai, **kw):
    return oai.chat.completions.create(model=NAME, messages=USER, temperature=0,
                                       **{"max_tokens": 8, **kw})


def test_the_served_name_is_listed_retrieved_and_required(oai, gateway):
    assert [m.id for m in oai.models.list().data] == [NAME]
    card = oai.models.retrieve(NAME)
    assert (card.id, card.object, card.owned_by) == (NAME, "model", "tl-engine")
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    r = oai.completions.create(model=NAME, prompt="Hi", max_tokens=2)
    assert r.model == NAME and r.usage.completion_tokens == 2
    status, _, body = http("GET", gateway + "/version")
    assert status == 200 and re.fullmatch(r"\d+\.\d+\.\d+.*", body["version"]), body


@pytest.mark.parametrize("alias, value, new", [
    ("guided_choice", ["yes", "no", "maybe"], {"choice": ["yes", "no", "maybe"]}),
    ("guided_regex", "[0-9]{3}", {"regex": "[0-9]{3}"}),
    ("guided_json", {"type": "object", "properties": {"a": {"type": "boolean"}},
                     "required": ["a"], "additionalProperties": False},
     {"json": {"type": "object", "properties": {"a": {"type": "boolean"}},
               "required": ["a"], "additionalProperties": False}})])
def test_each_guided_alias_is_structured_outputs(oai, alias, value, new):
    by_alias = greedy(oai, max_tokens=32, extra_body={alias: value})
    by_new = greedy(oai, max_tokens=32, extra_body={"structured_outputs": new})
    text = by_alias.choices[0].message.content
    assert text == by_new.choices[0].message.content
    assert by_alias.choices[0].finish_reason == "stop", text
    if alias == "guided_choice":
        assert text in value
    if alias == "guided_regex":
        assert re.fullmatch(value, text)


def test_an_alias_with_structured_outputs_is_a_400_naming_them(oai):
    with pytest.raises(openai.BadRequestError) as e:
        greedy(oai, extra_body={"guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}})
    assert e.value.body["param"] == "guided_choice"
    assert "structured_outputs" in e.value.body["message"]


def test_continue_final_message_and_template_kwargs_render_the_prompt(oai, gateway):
    said = [*USER, {"role": "assistant", "content": "Hello there, I am"}]
    body = {"messages": said, "add_generation_prompt": False, "continue_final_message": True}
    status, _, tokens = http("POST", gateway + "/tokenize", {**body, "return_token_strs": True})
    assert status == 200, tokens
    text = "".join(tokens["token_strs"]).replace("Ġ", " ").replace("Ċ", "\n")
    assert text.endswith("Hello there, I am"), text   # no end-of-turn after it
    r = oai.chat.completions.create(model=NAME, messages=said, max_tokens=4,
                                    extra_body={k: body[k] for k in body if k != "messages"})
    assert r.usage.prompt_tokens == tokens["count"]
    # a variable the template does not read changes nothing; one the render sets is a 400
    plain = greedy(oai)
    kwargs = greedy(oai, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kwargs.usage.prompt_tokens == plain.usage.prompt_tokens
    assert kwargs.choices[0].message.content == plain.choices[0].message.content
    for bad in ({"chat_template_kwargs": {"messages": []}}, {"continue_final_message": True}):
        with pytest.raises(openai.BadRequestError) as e:
            greedy(oai, extra_body=bad)
        assert e.value.body["param"] in bad


def test_cors_for_the_allowed_origin_only(gateway):
    asked = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = http("OPTIONS", gateway + "/v1/chat/completions",
                              headers={"Origin": SITE, **asked})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == SITE
    assert "POST" in headers["Access-Control-Allow-Methods"]
    status, headers, _ = http("OPTIONS", gateway + "/v1/chat/completions",
                              headers={"Origin": "https://evil.example", **asked})
    assert status == 405 and headers.get("Access-Control-Allow-Origin") is None
    status, headers, _ = http("GET", gateway + "/v1/models", headers={"Origin": SITE})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == SITE
    status, headers, _ = http("GET", gateway + "/v1/models",
                              headers={"Origin": "https://evil.example"})
    assert status == 200 and headers.get("Access-Control-Allow-Origin") is None


def test_a_client_that_disconnects_mid_stream_counts_as_an_abort(gateway, group):
    before = scrape(gateway)
    _, _, models = http("GET", gateway + "/v1/models")
    _, _, prompt = http("POST", gateway + "/tokenize", {"prompt": "Hi"})
    room = models["data"][0]["max_model_len"] - prompt["count"]   # the whole context: it
    long = {"model": NAME, "prompt": "Hi", "max_tokens": room, "ignore_eos": True,  # runs on
            "stream": True}

    async def leave_after_the_first_chunk():
        async with aiohttp.ClientSession() as s:
            async with s.post(gateway + "/v1/completions", json=long) as r:
                assert r.status == 200
                await r.content.readuntil(b"\n\n")
            # leaving the block closes the connection with the stream still running
    asyncio.run(leave_after_the_first_chunk())
    wait_until(lambda: moved(before, scrape(gateway), "tl_requests_finished_total",
                             finish_reason="abort") == 1, 20, "the abort counted")
    after = scrape(gateway)
    assert moved(before, after, "tl_requests_finished_total", finish_reason="length") == 0
    assert moved(before, after, "tl_http_requests_total", path="/v1/completions",
                 code="499") == 1
    wait_idle(group.address)   # and the engine let it go
