"""One generation request through the AsyncClient, answered as JSON or as Server-Sent Events.

The response starts only once the engine's first answer arrives, so a refusal (400, 429,
503) is still an HTTP status and not an event in a 200 stream. The AsyncClient stream is
always closed on the way out: a client that disconnects (aiohttp then cancels the
handler) aborts its request in the engine. An error after the stream started is sent as
an OpenAI error event (`data: {"error": ...}`), then `data: [DONE]`.
"""
from __future__ import annotations

import json
import time
from contextlib import aclosing

from aiohttp import web

from frontend.client.common import ClientError
from frontend.http.format import CompletionFormat, Tally
from frontend.http.metrics import Metrics
from frontend.http.schema import ApiError, GenRequest

RETRY_AFTER_S = 1  # a full queue drains within steps; clients should come back soon
ABORTED = "the engine aborted the request (shutting down or aborted by an operator)"


def api_error(e: ClientError) -> ApiError:
    return ApiError(e.code if e.code in (400, 413, 429, 503) else 503, e.message)


async def generate(request: web.Request, client, gen: GenRequest, fmt: CompletionFormat,
                   metrics: Metrics) -> web.StreamResponse:
    tally = Tally(time.monotonic())
    try:
        async with aclosing(client.stream(**gen.client_kwargs())) as deltas:
            first = await _next(deltas, tally)
            if first.finish_reason == "abort":  # nothing sent yet: still an HTTP status
                raise ApiError(503, ABORTED)
            if gen.stream:
                return await _answer_sse(request, deltas, first, tally, fmt)
            return await _answer_json(deltas, first, tally, fmt)
    finally:
        metrics.observe_request(tally)


async def _next(deltas, tally: Tally):
    try:
        d = await anext(deltas)
    except ClientError as e:
        raise api_error(e) from None
    tally.add(d, time.monotonic())
    return d


async def _answer_json(deltas, d, tally: Tally, fmt: CompletionFormat) -> web.Response:
    while d.finish_reason is None:
        d = await _next(deltas, tally)
    if d.finish_reason == "abort":
        raise ApiError(503, ABORTED)
    return web.json_response(fmt.body(tally))


async def _answer_sse(request: web.Request, deltas, d, tally: Tally,
                      fmt: CompletionFormat) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for chunk in fmt.opening(tally):
        await _event(resp, chunk)
    try:
        while True:
            await _send_delta(resp, d, tally, fmt)
            if d.finish_reason is not None:
                break
            d = await _next(deltas, tally)
    except ApiError as e:
        await _event(resp, e.body())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _send_delta(resp, d, tally: Tally, fmt: CompletionFormat) -> None:
    if d.finish_reason == "abort":
        raise ApiError(503, ABORTED)
    if d.text or d.finish_reason is not None:
        await _event(resp, fmt.chunk(tally, d.text, d.finish_reason))


async def _event(resp: web.StreamResponse, obj: dict) -> None:
    await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
