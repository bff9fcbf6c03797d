"""A client's disconnect fails the requests sent before it, never one sent after it.

The frontend dies and comes back on the same address. A request sent once zmq has seen
the disconnect waits in zmq for the reconnect and is served by the new frontend; only the
requests sent before the disconnect get the 503 (their fate is unknown). Both clients
check for disconnects before they register a request; the AsyncClient's watcher alone may
run late on a busy loop (CI's chaos soak saw a request answered 503 and then served).
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq

from core.ipc.channel import Router
from core.ipc.protocol import Abort, Delta, Deltas, Generate
from frontend.client import AsyncClient, Client, ClientError
from frontend.client.common import LOST_CONNECTION, make_generate


def frontend(ctx, address="tcp://127.0.0.1:0") -> Router:
    return Router(ctx, address, accept=(Generate, Abort), max_bytes=1 << 20)


def next_generate(router: Router, timeout_s: float = 10):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if router.poll(10):
            ident, msg = router.recv()
            if isinstance(msg, Generate):
                return ident, msg
    raise AssertionError("no Generate arrived")


def let_zmq_see_the_disconnect() -> None:
    """Time for zmq's own thread to notice the disconnect and tell the client's monitor,
    without running the client's loop (a sleep: polling the monitor here would take the
    edge of its file descriptor from the asyncio watcher)."""
    time.sleep(0.5)


def assert_lost(e: ClientError) -> None:
    assert e.code == 503 and e.message == LOST_CONNECTION, e


class Frontends:
    """The old frontend, then the new one on its address; every socket closed at the end
    (a context with an open socket never terminates)."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.old = frontend(self.ctx)
        self.address, self.new = self.old.address, None

    def restart(self) -> Router:
        self.old.sock.close(linger=0)
        let_zmq_see_the_disconnect()
        self.new = frontend(self.ctx, self.address)
        return self.new

    def close(self) -> None:
        for r in (self.old, self.new):
            if r is not None:
                r.sock.close(linger=0)
        self.ctx.term()


def run_with_frontends(main) -> None:
    """asyncio.run(main(frontends)), the sockets closed whatever happens."""
    f = Frontends()
    try:
        asyncio.run(asyncio.wait_for(main(f), 30))
    finally:
        f.close()


def test_async_client_fails_only_what_was_sent_before_the_disconnect():
    async def main(f: Frontends):
        async with AsyncClient(f.address, timeout=5) as c:
            before = asyncio.create_task(c.generate("x", request_id="before"))
            while not c._queues:   # sent
                await asyncio.sleep(0.01)
            next_generate(f.old)
            new = f.restart()   # the client's loop has not run since the disconnect
            after = asyncio.create_task(c.generate("y", request_id="after"))
            await asyncio.sleep(0)
            ident, msg = await asyncio.to_thread(next_generate, new)
            assert msg.request_id == "after"
            new.send(ident, Deltas.of([Delta("after", "ok", [5], finish_reason="length")]))
            result = await after
            assert result.text == "ok" and result.finish_reason == "length"
            with pytest.raises(ClientError) as e:
                await before
            assert_lost(e.value)

    run_with_frontends(main)


def test_blocking_client_fails_only_what_was_sent_before_the_disconnect():
    f = Frontends()
    c = Client(f.address, timeout=5)
    try:
        c._start(make_generate("x", request_id="before"))   # sent, not yet read
        next_generate(f.old)
        new = f.restart()
        t = threading.Thread(target=answer_one, args=(new,))
        t.start()
        try:
            result = c.generate("y", request_id="after")
        finally:
            t.join()
        assert result.text == "ok" and result.finish_reason == "length"
        with pytest.raises(ClientError) as e:
            list(c._deltas("before"))
        assert_lost(e.value)
    finally:
        c.close()
        f.close()


def answer_one(router: Router) -> None:
    try:
        ident, msg = next_generate(router)
    except AssertionError:
        return   # the client's wait fails the test
    router.send(ident, Deltas.of([Delta(msg.request_id, "ok", [5], finish_reason="length")]))


def test_a_flood_of_replies_leaves_the_streams_time_to_read():
    """5,000 deltas that have all arrived: the reader hands over at most a burst of them
    before the stream reads its first (it used to read every one first: awaiting a reply
    that has arrived never yields, and 1,000 streams starved while the frontend sent)."""
    from frontend.client.aio import READ_BURST
    fe = Frontends()

    def flood():
        ident, g = next_generate(fe.old)
        for i in range(5000):
            fe.old.send(ident, Deltas.of([Delta(g.request_id, "x", [i])]))
        fe.old.send(ident, Deltas.of([Delta(g.request_id, "", [], finish_reason="length")]))

    async def main():
        async with AsyncClient(fe.address, timeout=30) as c:
            t = threading.Thread(target=flood)
            t.start()
            stream = c.stream("hi", max_tokens=5000, request_id="flood")

            async def block_the_loop():   # while the thread's replies all arrive
                await asyncio.sleep(0.2)
                time.sleep(1.0)

            blocker = asyncio.create_task(block_the_loop())
            first = await stream.__anext__()
            waiting = c._queues["flood"].qsize()
            n = 1 + sum([1 async for _ in stream])
            await blocker
            t.join()
            return first, waiting, n

    try:
        first, waiting, n = asyncio.run(main())
    finally:
        fe.close()
    assert first.token_ids == [0] and n == 5001
    assert waiting < READ_BURST, waiting
