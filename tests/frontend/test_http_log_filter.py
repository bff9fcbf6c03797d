"""A request aiohttp cannot parse (an Authorization header past its 8,190 bytes) is logged in
one line that repeats nothing of what it sent (frontend/http/log_filter.py)."""
from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from frontend.http import log_filter

SECRET = "Bearer sk-THE-KEY-IN-THE-HEADER"


async def _send_oversized_header() -> bytes:
    app = web.Application()
    app.router.add_get("/", lambda r: web.Response(text="ok"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: {SECRET}".encode()
                     + b"A" * 9000 + b"\r\n\r\n")
        await writer.drain()
        reply = await reader.read(64)
        writer.close()
        return reply
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("filtered", [True, False])
def test_an_oversized_header_is_logged_without_its_value(caplog, filtered):
    logger = logging.getLogger(log_filter.LOGGER)
    before = list(logger.filters)
    if filtered:
        log_filter.install()
    try:
        with caplog.at_level(logging.INFO, logger=log_filter.LOGGER):
            reply = asyncio.run(_send_oversized_header())
    finally:
        logger.filters[:] = before
    assert reply.startswith(b"HTTP/1.") and b" 400 " in reply
    logged = caplog.text
    if filtered:   # one warning, no traceback, no byte of the header
        assert "LineTooLong (400)" in logged and "sk-THE-KEY" not in logged
        assert "Traceback" not in logged and "ERROR" not in logged
    else:   # the control: aiohttp alone quotes it
        assert "sk-THE-KEY" in logged
