"""The frontend's per-client cap, its Hello to the core, and clients noticing its death,
against the scripted fake core ("hang..." prompts never produce a token)."""
from __future__ import annotations

import asyncio
import signal
import time

import pytest

from core.ipc.protocol import AddRequest, Hello
from frontend.client import AsyncClient, ClientError
from tests.fake_core import FakeCore, FrontendProc, make_byte_tokenizer, model_info, running_engine
from tests.waiting import until

CAP = 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("limits"),
                        "--max-inflight-per-client", str(CAP)) as e:
        yield e


def test_the_frontend_says_hello_first(engine):
    first = engine.core.wait_for(lambda m: True)
    assert isinstance(first, Hello) and first.pid == engine.fe.proc.pid


def adds(engine, prefix: str) -> int:
    with engine.core._cv:
        return sum(isinstance(m, AddRequest) and m.request_id.startswith(prefix)
                   for m in engine.core.received)


async def wait_adds(engine, prefix: str, n: int) -> None:
    await until(lambda: adds(engine, prefix) >= n, what=f"{n} AddRequests {prefix}*")


def test_per_client_cap_is_429_and_other_clients_are_served(engine):
    async def run():
        async with AsyncClient(engine.address, timeout=10) as a, \
                AsyncClient(engine.address, timeout=10) as b:
            held = [asyncio.create_task(a.generate("hang", request_id=f"cap{i}"))
                    for i in range(CAP)]
            await wait_adds(engine, "cap", CAP)
            with pytest.raises(ClientError) as e:
                await a.generate("hello", max_tokens=50)
            other = await b.generate("hello", max_tokens=50)
            await a.abort("cap0")
            await held[0]
            freed = await a.generate("hello", max_tokens=50)   # one slot came back
            for t in held[1:]:
                t.cancel()
            await asyncio.gather(*held[1:], return_exceptions=True)
            return e.value, other, freed
    err, other, freed = asyncio.run(run())
    assert err.code == 429 and "max-inflight-per-client" in err.message
    assert other.text == freed.text == "hello"


def test_a_dead_frontend_fails_its_requests_with_503_at_once(tmp_path):
    core = FakeCore(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out",
                    model_info(make_byte_tokenizer(tmp_path / "tok")))
    core.ready.set()
    core.start()
    fe = FrontendProc(tmp_path, "--core-in", core.core_in, "--core-out", core.core_out,
                      "--address", "tcp://127.0.0.1:0")

    async def run():
        async with AsyncClient(fe.address, timeout=60) as c:
            task = asyncio.create_task(c.generate("hang", max_tokens=5))
            await until(lambda: core.wait_for(lambda m: isinstance(m, AddRequest), 0),
                        what="the request in the core")
            t0 = time.monotonic()
            fe.signal(signal.SIGKILL)
            with pytest.raises(ClientError) as err:
                await task
            return err.value, time.monotonic() - t0
    try:
        fe.wait_ready()
        err, took = asyncio.run(run())
    finally:
        fe.stop()
        core.stop()
    assert err.code == 503 and "lost the connection" in err.message
    assert took < 10, took   # the aim is 2 s; it is the time the socket's close takes to arrive


def test_the_gateway_pool_caps_each_user_and_packs_its_clients(engine):
    """The gateway counts per user (not per engine client) and fills an engine client up to
    the frontend's cap before it makes another: the frontend never refuses it."""
    from frontend.http.errors import ApiError
    from frontend.http.pool import ClientPool

    async def run():
        pool = ClientPool(engine.address, timeout=10, cap=CAP)
        try:
            a, b = pool.member("10.0.0.1"), pool.member("10.0.0.2")
            held = [asyncio.create_task(collect(a, "hang", f"pool{i}")) for i in range(CAP)]
            await wait_adds(engine, "pool", CAP)
            with pytest.raises(ApiError) as e:     # user 1 is at the cap ...
                await collect(a, "hello")
            other = await collect(b, "hello")       # ... user 2 is not
            members = len(pool)
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return e.value, other, members, pool.inflight_of("10.0.0.1")
        finally:
            await pool.close()
    err, other, members, left = asyncio.run(run())
    assert err.status == 429 and other == "hello"
    assert members == 2 and left == 0   # the first client was full: user 2 went to a second


async def collect(client, prompt: str, request_id: str | None = None) -> str:
    kw = {} if request_id is None else {"request_id": request_id}
    return "".join([d.text async for d in client.stream(prompt=prompt, max_tokens=50, **kw)])
