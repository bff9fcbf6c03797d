"""One generation body through the AsyncClient (n engine requests, see fanout.py),
answered as JSON or as Server-Sent Events.

The response starts only once every choice has the engine's first answer, so a refusal
(400, 429, 503) of any choice is still an HTTP status and not an event in a 200 stream.
A choice that fails fails the whole reply, and the other choices are aborted. An error
after the stream started is sent as an OpenAI error event (`data: {"error": ...}`), then
`data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from frontend.client.common import ClientError
from frontend.http.errors import ApiError
from frontend.http.fanout import FanOut
from frontend.http.format import CompletionFormat, Tally
from frontend.http.identity import key_hash
from frontend.http.metrics import Metrics
from frontend.http.prompt_logprob_fields import client_for
from frontend.http.schema import GenRequest

log = logging.getLogger("http")
RETRY_AFTER_S = 1  # a full queue drains within steps; clients should come back soon
ABORTED = "the engine aborted the request (shutting down or aborted by an operator)"


def api_error(e: ClientError, gen: GenRequest) -> ApiError:
    """The engine's error as the gateway's, its param the body field it came from."""
    return ApiError(e.code if e.code in (400, 413, 429, 503) else 503, e.message,
                    gen.param(e.param))


async def generate(request: web.Request, client, gen: GenRequest, fmt: CompletionFormat,
                   metrics: Metrics) -> web.StreamResponse:
    tallies = [Tally(time.monotonic()) for _ in range(gen.choices)]
    requests = [{**gen.client_kwargs(i), "key_hash": key_hash(request)}
                for i in range(gen.choices)]
    gone = False   # the client left (or the gateway stops): FanOut aborts what runs
    try:
        async with FanOut(client_for(gen.prompt_ask, client), requests, gen.n) as fan:
            early = []  # deltas that came before every choice had answered
            while not all(t.answered for t in tallies):
                early.append(await _next(fan, tallies, gen))
            if gen.stream:
                return await _answer_sse(request, fan, early, tallies, fmt, gen)
            while not _finished(tallies):
                await _next(fan, tallies, gen)
            return web.json_response(fmt.body(tallies))
    except (asyncio.CancelledError, ConnectionError):
        gone = True
        raise
    finally:
        for t in tallies:
            metrics.observe_request(t, aborted=gone)


def _finished(tallies: list[Tally]) -> bool:
    return all(t.finish_reason is not None for t in tallies)


async def _next(fan: FanOut, tallies: list[Tally], gen: GenRequest):
    try:
        i, d = await fan.next()
    except ClientError as e:
        raise api_error(e, gen) from None
    tallies[i].add(d, time.monotonic())
    if d.finish_reason == "abort":
        raise ApiError(503, ABORTED)
    return i, d


async def _answer_sse(request: web.Request, fan: FanOut, early: list, tallies: list[Tally],
                      fmt: CompletionFormat, gen: GenRequest) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await _send(resp, fmt, fmt.opening(tallies))
    try:
        for i, d in early:
            await _send(resp, fmt, fmt.chunk(tallies, i, d))
        while not _finished(tallies):
            i, d = await _next(fan, tallies, gen)
            await _send(resp, fmt, fmt.chunk(tallies, i, d))
        await _send(resp, fmt, fmt.closing(tallies))
    except ApiError as e:
        await _send(resp, fmt, fmt.failure(e.body()))
    except ConnectionError:   # the client left: nothing to tell it
        raise
    except Exception as e:  # noqa: BLE001  a stream that fails still ends as a stream
        log.warning("a streamed reply failed: %s: %.200s", type(e).__name__, e)
        await _send(resp, fmt, fmt.failure(ApiError(500, f"the reply could not be formed "
                                                         f"({type(e).__name__})").body()))
    if fmt.done:
        await resp.write(fmt.done)
    await resp.write_eof()
    return resp


async def _send(resp: web.StreamResponse, fmt, events) -> None:
    """`events`: one event, a list of them, or None (nothing to send); each framed by the
    format (`data: {...}`, or a Responses `event:` line too)."""
    for event in events if isinstance(events, list) else [events]:
        if event is not None:
            await resp.write(fmt.frame(event))
