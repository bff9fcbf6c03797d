"""The chaos benchmark's count of final replies (scripts/benchmarks/chaos.py CountingClient).

A request answered 503 on a lost connection may still be served by the next frontend (its
Generate waited in zmq's queue): that final is a stray after the 503, not a second answer.
A second final after a frontend's own final is an engine bug, and counts as one.
"""
from __future__ import annotations

import asyncio

import pytest

from core.ipc.protocol import Delta, Deltas
from frontend.client import ClientError
from scripts.benchmarks.chaos import CountingClient, one_final
from tests.frontend.test_client_reconnect import (Frontends, assert_lost, next_generate,
                                                  run_with_frontends)


def final(request_id: str) -> Deltas:
    return Deltas.of([Delta(request_id, "ok", [5], finish_reason="length")])


def test_a_final_after_a_lost_connections_503_is_a_stray_and_allowed():
    async def main(f: Frontends):
        async with CountingClient(f.address, timeout=5) as c:
            lost = asyncio.create_task(c.generate("x", request_id="a"))
            ident, _ = await asyncio.to_thread(next_generate, f.old)
            new = f.restart()
            with pytest.raises(ClientError) as e:
                await lost
            assert_lost(e.value)
            # the next frontend serves it anyway, as if the Generate had waited in zmq
            later = asyncio.create_task(c.generate("y", request_id="b"))
            ident, _ = await asyncio.to_thread(next_generate, new)
            new.send(ident, final("a"))
            new.send(ident, final("b"))
            await later
            assert (c.finals["a"], c.strays["a"]) == (1, 1)
            assert (c.finals["b"], c.strays["b"]) == (1, 0)
            assert one_final({"id": "a", "error": e.value.message}, c.finals, c.strays)
            assert one_final({"id": "b"}, c.finals, c.strays)
    run_with_frontends(main)


def test_a_second_final_from_the_frontend_is_not_one_final():
    async def main(f: Frontends):
        async with CountingClient(f.address, timeout=5) as c:
            served = asyncio.create_task(c.generate("x", request_id="a"))
            ident, _ = await asyncio.to_thread(next_generate, f.old)
            f.old.send(ident, final("a"))
            await served
            f.old.send(ident, final("a"))
            await asyncio.sleep(0.3)   # the reader takes it
            assert (c.finals["a"], c.strays["a"]) == (1, 1)
            assert not one_final({"id": "a"}, c.finals, c.strays)
    run_with_frontends(main)
