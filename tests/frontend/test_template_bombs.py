"""Hostile chat templates (frontend/http/render_bound.py): a render is bounded in time and
runs off the gateway's event loop; a template that cannot render one message is refused
when the gateway starts; one that fails on a request is a 500 in OpenAI's shape, in one
line, and the gateway serves on."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from transformers import AutoTokenizer

from frontend.http.app import Gateway, make_app
from frontend.http.chat import ChatTemplate
from frontend.http.errors import ApiError
from frontend.http.metrics import Metrics
from frontend.http.render_bound import RENDER_S, TemplateRefused, bounded
from worker.presets import preset_dir

from tests.frontend.test_http_floods import Answers

LOOPS = ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
         "{{ messages[0]['content'] }}")
# renders a one-message chat; loops only when a message asks it to
ON_DEMAND = ("{% for m in messages %}{% if m['content'] == 'boom' %}" + LOOPS
             + "{% endif %}{{ m['content'] }}{% endfor %}")
BOUND_S = 5 * RENDER_S   # fault deadlines are asserted at 5x their target


def template(text: str) -> ChatTemplate:
    hf = AutoTokenizer.from_pretrained(str(preset_dir("tiny")))
    hf.chat_template = text
    return ChatTemplate(hf, builtin=False)


def test_a_runaway_render_stops_at_its_deadline():
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        template(LOOPS).prompt([{"role": "user", "content": "hi"}])
    assert e.value.status == 500 and "ran past" in e.value.message
    assert time.monotonic() - t0 < BOUND_S


@pytest.mark.parametrize("text,words", [
    (LOOPS, "ran past"),
    ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),
    ("{{ raise_exception('no chats here') }}", "no chats here"),
])
def test_a_template_that_cannot_render_one_message_is_refused_at_start(text, words):
    with pytest.raises(TemplateRefused) as e:
        template(text).dry_render()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bounded_returns_what_a_quick_render_gives_and_refuses_a_huge_one():
    assert bounded(lambda: "abc") == "abc"
    with pytest.raises(ValueError):
        bounded(lambda: "x" * ((16 << 20) + 1))


def test_a_bomb_request_gets_a_500_and_the_gateway_answers_meanwhile():
    """A chat whose message sets the template's loops off: a 500 in OpenAI's shape within
    the bound, while /v1/models is answered during its render."""
    async def run():
        gw = Gateway(Answers(), "m", 2048, template(ON_DEMAND), Metrics(), 0)
        server = TestServer(make_app(gw))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                bomb = asyncio.ensure_future(s.post(
                    str(server.make_url("/v1/chat/completions")),
                    json={"messages": [{"role": "user", "content": "boom"}]}))
                await asyncio.sleep(0.2)
                t0 = time.monotonic()
                async with s.get(str(server.make_url("/v1/models"))) as h:
                    health = (h.status, time.monotonic() - t0)
                r = await bomb
                return health, r.status, await r.json()
        finally:
            await server.close()
    t0 = time.monotonic()
    (health_status, health_s), status, body = asyncio.run(run())
    assert health_status == 200 and health_s < RENDER_S
    assert status == 500 and "ran past" in body["error"]["message"]
    assert time.monotonic() - t0 < BOUND_S + 2
