"""AsyncClient against a real frontend process and the fake core."""
from __future__ import annotations

import asyncio

import pytest

from core.ipc.protocol import Delta, Deltas, ErrorReply
from frontend.client import AsyncClient, ClientError
from tests.fake_core import running_engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("async")) as e:
        yield e


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_32_concurrent_requests(engine):
    async def main():
        async with AsyncClient(engine.address, timeout=10) as c:
            prompts = [f"request {i} é€" for i in range(32)]
            results = await asyncio.gather(*(c.generate(p, max_tokens=100) for p in prompts))
            assert [r.text for r in results] == prompts
            assert all(r.finish_reason == "stop" for r in results)
            assert len({r.request_id for r in results}) == 32

    run(main())


def test_streams_and_stats_together(engine):
    async def collect(c, prompt):
        return "".join([d.text async for d in c.stream(prompt, max_tokens=100)])

    async def main():
        async with AsyncClient(engine.address, timeout=10) as c:
            out = await asyncio.gather(*(collect(c, f"s{i}") for i in range(8)),
                                       c.stats(), c.stats())
            assert out[:8] == [f"s{i}" for i in range(8)]
            assert all("steps" in stats for stats in out[8:])

    run(main())


def test_abort_and_abandon(engine):
    async def main():
        async with AsyncClient(engine.address, timeout=10) as c:
            s = c.stream("slow abcdefgh", max_tokens=100, request_id="a-abort")
            await s.__anext__()
            await c.abort("a-abort")
            rest = [d async for d in s]
            assert rest[-1].finish_reason == "abort"
            async for _ in c.stream("slow abcdefgh", max_tokens=100, request_id="a-leave"):
                break
            # the dropped generator's aclose runs on the loop while abort_of waits (5 s)
            for request_id in ("a-abort", "a-leave"):
                got = await asyncio.to_thread(engine.core.abort_of, engine.fid(request_id))
                assert got is not None, request_id

    run(main())


def test_errors(engine):
    async def main():
        async with AsyncClient(engine.address, timeout=0.5) as c:
            for kwargs, code in ((dict(prompt="reject"), 429), (dict(prompt=""), 400),
                                 (dict(prompt="hang"), 503), (dict(prompt="x", top_k=-2), 400)):
                with pytest.raises(ClientError) as e:
                    await c.generate(**kwargs)
                assert e.value.code == code, kwargs
            assert (await c.generate("ok")).text == "ok"

    run(main())


def test_a_disconnect_after_the_last_reply_adds_no_second_one(engine):
    """A request whose final reply is queued but not yet read is over: the frontend's
    connection dropping then must not queue it a 503 as well (one final reply each)."""
    async def main():
        async with AsyncClient(engine.address, timeout=10) as c:
            s = c.stream("slow abcdefgh", max_tokens=100, request_id="a-final")
            first = await s.__anext__()
            queue = c._queues["a-final"]
            c._dispatch(Delta("a-final", "", [], finish_reason="length"))
            assert c.inflight == 0
            c._fail_all(ErrorReply(None, 503, "lost"))
            rest = [d async for d in s]
            assert first.finish_reason is None and [d.finish_reason for d in rest][-1] == "length"
            assert all(d.finish_reason is None for d in rest[:-1]) and queue.empty()

    run(main())


def test_a_cancel_that_is_accepted_always_ends_the_wait_for_a_reply():
    """The gateway cancels a stream whose HTTP client left; the stream's `finally` then
    aborts the request. A cancel that lands after the next reply was queued but before the
    waiting task resumed must still end the wait (Python 3.11's asyncio.wait_for returned
    the reply instead, and the stream ran on to its end)."""
    async def main():
        c = AsyncClient("tcp://127.0.0.1:9", timeout=5)
        try:
            for k in range(6):   # every moment from the reply's arrival to the wake-up
                queue = asyncio.Queue()
                task = asyncio.create_task(c._next(queue))
                await asyncio.sleep(0)   # one loop turn each: the moments are the point
                queue.put_nowait("reply")
                for _ in range(k):
                    await asyncio.sleep(0)
                if task.cancel():
                    with pytest.raises(asyncio.CancelledError):
                        await task
                else:
                    assert await task == "reply"
        finally:
            await c.close()

    run(main())


def test_a_final_reply_sent_just_before_the_frontend_dies_is_the_answer(tmp_path):
    """The frontend answers and dies at once: the client sees the disconnect, but the
    final reply already received is the request's answer (one final reply, not a 503)."""
    import zmq

    from core.ipc.channel import Router
    from core.ipc.protocol import Generate

    async def main():
        ctx = zmq.Context()
        router = Router(ctx, "tcp://127.0.0.1:0", accept=(Generate,), max_bytes=1 << 20)
        try:
            async with AsyncClient(router.address, timeout=10) as c:
                task = asyncio.create_task(c.generate("x", request_id="last"))
                ident = None
                while ident is None:
                    if router.poll(10):
                        ident, _ = router.recv()
                    await asyncio.sleep(0)   # the client's task sends meanwhile
                router.send(ident, Deltas.of([Delta("last", "done", [7], finish_reason="length")]))
                router.sock.close(linger=1000)
                result = await task
                assert result.finish_reason == "length" and result.text == "done"
        finally:
            ctx.term()

    for _ in range(5):
        run(main())


def test_a_wait_times_out_once_and_a_reply_at_the_deadline_leaves_no_stale_timeout():
    """Waits are timed by the client's one clock task: a stream with no reply gets its 503
    between the timeout and a quarter of it later; a reply queued before the clock's turn
    at the deadline is the answer, and the next wait is timed afresh (no marker left)."""
    async def main():
        c = AsyncClient("tcp://127.0.0.1:9", timeout=0.4)
        try:
            c._ensure_reader()
            queue = asyncio.Queue()
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(ClientError) as e:
                await c._next(queue)
            waited = asyncio.get_running_loop().time() - t0
            assert e.value.code == 503 and 0.4 <= waited < 0.4 + 0.1 + 0.3, waited
            assert queue.empty() and not c._waiting
            task = asyncio.create_task(c._next(queue))
            await asyncio.sleep(0)
            queue.put_nowait("reply")   # the reply, then the clock's turn, past the deadline
            c._wake_late(float("inf"))
            assert await task == "reply" and queue.empty()
            queue.put_nowait("next")
            assert await c._next(queue) == "next"
        finally:
            await c.close()

    run(main())
