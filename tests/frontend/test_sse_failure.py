"""A streamed reply that fails after its 200 still ends as a stream: an error event in
OpenAI's shape, then `data: [DONE]` (frontend/http/generate.py), whatever raised."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from frontend.http import generate
from frontend.http.format import CompletionFormat


class _Failing(CompletionFormat):
    """A reply format (framing its events as chat's and completions' do) whose every chunk
    raises what hostile model output once did."""

    def __init__(self):
        pass

    def opening(self, tallies):
        return [{"opening": True}]

    def chunk(self, tallies, i, d):
        raise RecursionError("maximum recursion depth exceeded")


async def _serve_and_read() -> str:
    async def handler(request):
        tallies = [SimpleNamespace(finish_reason=None)]
        return await generate._answer_sse(request, None, [(0, object())], tallies,
                                          _Failing(), None)

    app = web.Application()
    app.router.add_get("/s", handler)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/s")
        assert resp.status == 200
        return await resp.text()


def test_a_stream_that_fails_ends_with_an_error_event_and_done():
    text = asyncio.run(_serve_and_read())
    events = [line[len("data: "):] for line in text.split("\n\n") if line]
    assert events[0] == '{"opening":true}' and events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "RecursionError" in error["message"]
