"""The gateway's app in-process against hostile HTTP: bodies with lone surrogates, deep
nesting, out-of-range numbers; bodies that never finish; clients that disconnect.

A stand-in for the AsyncClient answers every request that gets through, so a 400 here is
the gateway's own refusal.
"""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.ipc.protocol import Delta
from frontend.http.app import Gateway, make_app
from frontend.http.metrics import Metrics
from tests.waiting import until

MAX_MODEL_LEN = 64


class SlowClient:
    """Stands in for AsyncClient: one delta, then a finish after `pause` seconds."""

    def __init__(self, pause: float = 0.0):
        self.pause = pause

    async def _stream(self):
        yield Delta("r", "hi", [1], None, [7, 8])
        await asyncio.sleep(self.pause)   # the point: an engine slow to finish
        yield Delta("r", "", [2], "length")

    def stream(self, prompt, **kw):
        return self._stream()

    async def stats(self):
        return {"pids": {}}


def app(pause: float = 0.0, body_timeout: float = 10.0):
    return make_app(Gateway(SlowClient(pause), "m", MAX_MODEL_LEN, None, Metrics(), 0,
                            body_timeout))


def post_raw(raw: bytes, path: str = "/v1/completions") -> tuple[int, dict]:
    async def run():
        async with TestClient(TestServer(app())) as c:
            r = await c.post(path, data=raw, headers={"Content-Type": "application/json"})
            return r.status, await r.json()
    return asyncio.run(run())


def big(n: int) -> bytes:
    return str(n).encode()


HOSTILE = [
    ("surrogate in prompt", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("low surrogate in prompt", b'{"prompt": "\\udfff"}', "prompt"),
    ("surrogate in stop", b'{"prompt": "x", "stop": ["\\udbff"]}', "stop"),
    ("surrogate in user", b'{"prompt": "x", "user": "\\ud800"}', "user"),
    ("surrogate in a key", b'{"prompt": "x", "\\ud800": 1}', "body"),
    ("deep nesting", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body"),
    ("nesting past the limit", b'{"prompt": "x", "u": ' + b"[" * 40 + b"]" * 40 + b"}", "u"),
    ("token id 2**64", b'{"prompt": [1, ' + big(2 ** 64) + b"]}", "prompt"),
    ("max_tokens 2**64", b'{"prompt": "x", "max_tokens": ' + big(2 ** 64) + b"}", "max_tokens"),
    ("max_tokens 2**63", b'{"prompt": "x", "max_tokens": ' + big(2 ** 63) + b"}", "max_tokens"),
    ("max_tokens past max_model_len", b'{"prompt": "x", "max_tokens": 65}', "max_tokens"),
    ("seed 2**63", b'{"prompt": "x", "seed": ' + big(2 ** 63) + b"}", "seed"),
    ("seed -2**64", b'{"prompt": "x", "seed": ' + big(-2 ** 64) + b"}", "seed"),
    ("top_k 2**31", b'{"prompt": "x", "top_k": ' + big(2 ** 31) + b"}", "top_k"),
    ("n 2**70", b'{"prompt": "x", "n": ' + big(2 ** 70) + b"}", "n"),
    ("5000 digits", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", "body"),
    ("temperature 1e999", b'{"prompt": "x", "temperature": 1e999}', "temperature"),
    ("temperature NaN", b'{"prompt": "x", "temperature": NaN}', "body"),
    ("top_p -Infinity", b'{"prompt": "x", "top_p": -Infinity}', "body"),
    ("temperature 1e5", b'{"prompt": "x", "temperature": 1e5}', "temperature"),
    ("temperature 1e-300", b'{"prompt": "x", "temperature": 1e-300}', "temperature"),
    ("top_p 0", b'{"prompt": "x", "top_p": 0}', "top_p"),
    ("17 stops", json.dumps({"prompt": "x", "stop": ["s"] * 17}).encode(), "stop"),
    ("a long stop", json.dumps({"prompt": "x", "stop": "s" * 257}).encode(), "stop"),
    ("priority 1001 in the body", b'{"prompt": "x", "priority": 1001}', "priority"),
    ("an unknown field", b'{"prompt": "x", "tempreature": 1}', "tempreature"),
]


@pytest.mark.parametrize("raw,param", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_get_400_naming_the_problem(raw, param):
    status, body = post_raw(raw)
    assert status == 400, body
    assert body["error"]["code"] == 400 and body["error"]["message"]
    assert body["error"]["param"] == param, body


def test_hostile_chat_bodies_get_400():
    status, body = post_raw(b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                            "/v1/chat/completions")
    assert status == 400 and "surrogate" in body["error"]["message"], body
    status, body = post_raw(b'{"messages": [{"role": "user", "content": "x"}], '
                            b'"max_completion_tokens": ' + big(2 ** 64) + b"}",
                            "/v1/chat/completions")
    assert status == 400 and body["error"]["param"] == "max_completion_tokens", body


def test_in_range_extremes_pass():
    ok = {"prompt": [0, 2 ** 64 - 1], "max_tokens": MAX_MODEL_LEN, "seed": 2 ** 63 - 1,
          "top_k": 2 ** 31 - 1, "temperature": 1e4, "top_p": 5e-324, "stop": ["s" * 256] * 16,
          "user": "\ud83d\ude00"}
    status, body = post_raw(json.dumps(ok).encode())
    assert status == 200, body


# ------------------------------------------------------------------ bodies that never end


async def raw_exchange(head: bytes, body_part: bytes, body_timeout: float) -> tuple[bytes, float]:
    """Send a request whose body never completes; (what came back until EOF, seconds to
    the reply's first byte)."""
    server = TestServer(app(body_timeout=body_timeout))
    await server.start_server(lingering_time=0.1)   # the EOF the test reads comes after it
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        loop = asyncio.get_running_loop()
        start = loop.time()
        writer.write(head + body_part)
        await writer.drain()
        first = await asyncio.wait_for(reader.read(1), body_timeout + 5)
        took = loop.time() - start
        rest = await asyncio.wait_for(reader.read(), 10)  # EOF: the server closed
        writer.close()
        return first + rest, took
    finally:
        await server.close()


HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")


@pytest.mark.parametrize("head,part", [
    (HEAD + b"Content-Length: 100\r\n\r\n", b'{"prompt": "x"'),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b'5\r\n{"pro\r\n'),
], ids=["content-length past the body", "chunked without an end"])
def test_a_body_that_never_ends_gets_408_and_the_connection_closes(head, part):
    reply, took = asyncio.run(raw_exchange(head, part, body_timeout=0.25))
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"Connection: close" in reply and b'"code": 408' in reply
    assert took < 4, took


# ------------------------------------------------------------------ disconnects


async def handled(server: TestServer) -> None:
    """Until the server is done with every connection it had."""
    await until(lambda: not server.runner.server.connections, what="the handler's end")


async def disconnect_mid_body():
    server = TestServer(app())
    await server.start_server()
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(HEAD + b"Content-Length: 100\r\n\r\n{\"prompt\"")
        await writer.drain()
        # its head read, the request waits for the rest of the body (an abort before that
        # would reset the connection with the bytes unread: no request at all)
        await until(lambda: server.runner.server.requests_count == 1, what="the request")
        writer.transport.abort()
        await handled(server)
    finally:
        await server.close()


async def disconnect_mid_stream():
    # as the gateway's server runs (frontend/http/server.py): a client's leaving cancels it
    async with TestClient(TestServer(app(pause=30), handler_cancellation=True)) as c:
        r = await c.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert r.status == 200
        await r.content.readline()
        r.close()
        await handled(c.server)


@pytest.mark.parametrize("scenario", [disconnect_mid_body, disconnect_mid_stream])
def test_disconnects_log_one_info_line_and_no_traceback(scenario, caplog):
    caplog.set_level(logging.DEBUG, logger="http")
    caplog.set_level(logging.INFO, logger="aiohttp")
    asyncio.run(scenario())
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    gone = [r for r in caplog.records if r.name == "http" and "disconnected" in r.getMessage()]
    assert len(gone) == 1, [r.getMessage() for r in caplog.records]
