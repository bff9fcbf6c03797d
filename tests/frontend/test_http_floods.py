"""One HTTP user must not starve, stall or bloat the others (issue 29, items 4-6): the
gateway in-process, a real frontend over the scripted fake core behind it, HTTP peers on
distinct loopback addresses (each one user today, frontend/http/identity.py).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.ipc.protocol import AddRequest
from frontend.http.app import Gateway, make_app
from frontend.http.chat_special import ChatPrompt
from frontend.http.metrics import Metrics
from frontend.http.pool import ClientPool
from frontend.http.reply_bound import MAX_REPLY_ENTRIES
from tests.fake_core import MAX_MODEL_LEN, running_engine
from tests.waiting import until

CAP = 2


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("floods"),
                        "--max-inflight-per-client", str(CAP)) as e:
        yield e


def held(engine, prefix: str) -> int:
    """Engine requests of prompts starting with `prefix` the core has seen."""
    with engine.core._cv:
        return sum(isinstance(m, AddRequest)
                   and bytes(int(t) for t in m.prompt[:len(prefix)]) == prefix.encode()
                   for m in engine.core.received)


async def post(url: str, peer: str, body: dict) -> tuple[int, dict]:
    """POST /v1/completions from source address `peer`."""
    conn = aiohttp.TCPConnector(local_addr=(peer, 0))
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.post(url + "/v1/completions", json=body) as r:
            return r.status, await r.json()


def with_gateway(engine, scenario):
    """Run `scenario(url, pool)` against an in-process gateway on a ClientPool."""
    async def run():
        pool = ClientPool(engine.address, 20, CAP)
        server = TestServer(make_app(Gateway(pool, "m", MAX_MODEL_LEN, None, Metrics(), 0)))
        await server.start_server()
        try:
            return await scenario(str(server.make_url("")).rstrip("/"), pool)
        finally:
            await server.close()
            await pool.close()
    return asyncio.run(run())


# ------------------------------------------------------------------ item 4: the cap


def test_a_fresh_peer_is_served_when_many_others_are_at_their_cap(engine):
    """70 peers each hold CAP requests; a 71st, with nothing in flight, is served (the
    pool used to share full per-peer clients by hash: 429 for another's load)."""
    peers = [f"127.0.1.{i}" for i in range(1, 71)]

    async def scenario(url, pool):
        hang = [asyncio.create_task(post(url, p, {"prompt": f"hang-a{k}", "max_tokens": 5}))
                for p in peers for k in range(CAP)]
        await until(lambda: held(engine, "hang-a") == len(hang) or any(t.done() for t in hang),
                    timeout=20)
        refused = [t.result() for t in hang if t.done()]
        assert not refused, refused[:2]   # a peer refused while under its own cap
        fresh = [await post(url, f"127.0.2.{i}", {"prompt": "hello", "max_tokens": 5})
                 for i in range(1, 4)]
        over = await post(url, peers[0], {"prompt": "hang-over", "max_tokens": 5})
        counts = {p: pool.inflight_of(p) for p in peers}
        for t in hang:
            t.cancel()
        await asyncio.gather(*hang, return_exceptions=True)
        return fresh, over, counts, len(pool)

    fresh, (status, body), counts, members = with_gateway(engine, scenario)
    assert [s for s, _ in fresh] == [200, 200, 200], fresh
    assert all(b["choices"][0]["text"] == "hello" for _, b in fresh)
    assert status == 429 and "already has 2 of its 2 requests in flight" in body["error"]["message"]
    assert set(counts.values()) == {CAP}
    assert members <= 70 * CAP // CAP + 1


def test_a_user_is_capped_across_clients_and_a_body_counts_its_choices(engine):
    """A user's count is theirs wherever their requests run; n choices are n requests."""
    async def scenario(url, pool):
        one = asyncio.create_task(post(url, "127.0.3.1", {"prompt": "hang-b", "max_tokens": 5}))
        await until(lambda: held(engine, "hang-b") == 1, timeout=20)
        two = await post(url, "127.0.3.1", {"prompt": "hang-c", "max_tokens": 5, "n": 2})
        other = await post(url, "127.0.3.2", {"prompt": "hi", "max_tokens": 5, "n": 2})
        one.cancel()
        await asyncio.gather(one, return_exceptions=True)
        await until(lambda: pool.inflight_of("127.0.3.1") == 0, timeout=20)
        again = await post(url, "127.0.3.1", {"prompt": "hi", "max_tokens": 5, "n": 2})
        return two, other, again

    (s2, b2), (so, bo), (sa, ba) = with_gateway(engine, scenario)
    assert s2 == 429 and b2["error"]["type"] == "rate_limit_error", b2
    assert so == 200 and [c["text"] for c in bo["choices"]] == ["hi", "hi"], bo
    assert sa == 200, ba


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"input": ["a", "b"]}),
    ("/v1/score", {"text_1": "a", "text_2": ["b", "c"]}),
    ("/v1/rerank", {"query": "a", "documents": ["b"]})])
def test_the_embedding_routes_count_toward_the_users_cap(engine, path, body):
    """Each text embedded is one engine request of the user: past the cap, a 429 before any
    reaches the engine (another user's requests are not counted)."""
    async def scenario(url, pool):
        hang = "hang-e" + path   # the fake core holds it; held() counts every one it saw
        one = asyncio.create_task(post(url, "127.0.3.5", {"prompt": hang, "max_tokens": 5}))
        await until(lambda: held(engine, hang) == 1, timeout=20)
        adds = held(engine, "")
        conn = aiohttp.TCPConnector(local_addr=("127.0.3.5", 0))
        async with aiohttp.ClientSession(connector=conn) as s:
            async with s.post(url + path, json=body) as r:
                status, reply = r.status, await r.json()
        sent = held(engine, "") - adds
        one.cancel()
        await asyncio.gather(one, return_exceptions=True)
        await until(lambda: pool.inflight_of("127.0.3.5") == 0, timeout=20)
        return status, reply, sent

    status, reply, sent = with_gateway(engine, scenario)
    assert status == 429 and reply["error"]["type"] == "rate_limit_error", reply
    assert sent == 0


# ------------------------------------------------------------------ item 6: a reply's size


class Answers:
    """Stands in for the engine: every request ends at once with one token."""

    async def _stream(self):
        from core.ipc.protocol import Delta
        yield Delta("r", "x", [1], "length", [7])

    def stream(self, prompt, **kw):
        return self._stream()


class Template:
    """ChatTemplate's interface, without a tokenizer: the messages' text joined."""
    tokenizer = None
    tool_format = "hermes"

    def prompt(self, messages, options=None, tools=None):
        return ChatPrompt("".join(m["content"] for m in messages))


def post_local(path: str, body: dict, max_model_len: int = 2048) -> tuple[int, dict]:
    async def run():
        gw = Gateway(Answers(), "m", max_model_len, Template(), Metrics(), 0)
        server = TestServer(make_app(gw))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(str(server.make_url(path)), json=body) as r:
                    return r.status, await r.json()
        finally:
            await server.close()
    return asyncio.run(run())


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "n": 16, "logprobs": True, "top_logprobs": 20},
     "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "n": 16, "logprobs": True, "max_tokens": 16384}, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 20, "max_tokens": 2048, "n": 4},
     "logprobs"),
    ("/v1/completions", {"prompt": ["x"] * 8, "logprobs": 20, "max_tokens": 1000},
     "logprobs"),
    # prompt logprobs: token ids count their length (8 x 1000 x 21), a text max_model_len - 1
    ("/v1/completions", {"prompt": [[1] * 1000] * 8, "prompt_logprobs": 20, "max_tokens": 1},
     "prompt_logprobs"),
    ("/v1/completions", {"prompt": ["x"] * 9, "echo": True, "logprobs": 0, "max_tokens": 0},
     "prompt"),
    ("/v1/chat/completions", {**CHAT, "n": 9, "prompt_logprobs": 0, "max_tokens": 1}, "n"),
], ids=["chat without max_tokens", "chat n=16", "completions", "a batch of prompts",
        "prompt_logprobs of token ids", "echo of texts", "chat prompt_logprobs n=9"])
def test_a_reply_past_the_logprobs_bound_is_400_naming_the_param(path, body, param):
    status, reply = post_local(path, body, max_model_len=16384)
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply
    assert str(MAX_REPLY_ENTRIES) in reply["error"]["message"], reply


def test_replies_up_to_the_bound_pass():
    most = MAX_REPLY_ENTRIES // (16 * 21)
    for path, body in [
            ("/v1/chat/completions", {**CHAT, "n": 16, "logprobs": True, "top_logprobs": 20,
                                      "max_tokens": most}),
            ("/v1/chat/completions", {**CHAT, "n": 16}),   # no logprobs: text only
            ("/v1/completions", {"prompt": "x", "logprobs": 20, "max_tokens": 2048}),
            ("/v1/completions", {"prompt": [[1] * 1000] * 6, "prompt_logprobs": 20,
                                 "max_tokens": 1}),
            ("/v1/completions", {"prompt": ["x"] * 3, "echo": True, "logprobs": 20,
                                 "max_tokens": 0})]:
        status, reply = post_local(path, body)
        assert status == 200, (body, reply)


# ------------------------------------------------------------------ item 5: /tokenize


@pytest.fixture(scope="module")
def long_token_template(tmp_path_factory):
    """The byte tokenizer plus a 10 KB token: 500 KB of text has no bound that refuses it
    over a 128-token context, so /tokenize tokenizes it whole (and then refuses it)."""
    from frontend.http.chat import ChatTemplate
    from tests.frontend.test_frontend_floods import long_token_tokenizer
    return ChatTemplate.load(long_token_tokenizer(tmp_path_factory.mktemp("tok") / "t", 10_000))


def poll_models(url: str, waits: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            assert r.status == 200
        waits.append(time.monotonic() - t0)
        stop.wait(0.02)


def test_tokenize_floods_leave_the_loop_free(long_token_template):
    """Six peers /tokenize ~500 KB each while /v1/models is polled: it answers in a small
    part of one tokenizing's time (the loop used to tokenize them itself, in turn)."""
    text = "x" * 500_000
    t0 = time.perf_counter()
    long_token_template.tokenizer(text)
    one = time.perf_counter() - t0
    raw = json.dumps({"prompt": text}).encode()

    async def run():
        gw = Gateway(Answers(), "m", MAX_MODEL_LEN, long_token_template, Metrics(), 0)
        server = TestServer(make_app(gw))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        try:
            async def flood(i: int):
                conn = aiohttp.TCPConnector(local_addr=(f"127.0.4.{i}", 0))
                async with aiohttp.ClientSession(connector=conn) as s:
                    async with s.post(url + "/tokenize", data=raw,
                                      headers={"Content-Type": "application/json"}) as r:
                        return r.status, await r.json()

            waits: list[float] = []
            stop = threading.Event()
            poller = threading.Thread(target=poll_models, args=(url, waits, stop))
            poller.start()   # a thread: its clock runs while the server's loop is stuck
            try:
                floods = [asyncio.create_task(flood(i)) for i in range(1, 7)]
                await asyncio.gather(*floods)
            finally:
                stop.set()
                await asyncio.to_thread(poller.join)
            return waits, [f.result() for f in floods]
        finally:
            await server.close()

    waits, results = asyncio.run(run())
    assert max(waits) < one / 2, (max(waits), one)
    for status, body in results:
        if status == 429:   # the tokenizer's queue was full (QUEUED): refused, not stalled
            continue
        assert status == 400 and "more than max_model_len" in body["error"]["message"], body
    assert sum(s == 400 for s, _ in results) >= 2


def test_tokenize_refuses_what_cannot_fit_before_tokenizing(tmp_path):
    """With the byte tokenizer (no token over 13 bytes) 2 KB is at least 158 tokens."""
    from frontend.http.tokens import Tokens, tokenize

    class Spy:
        def __init__(self, hf):
            self.backend_tokenizer, self.calls = hf.backend_tokenizer, 0
            self.get_vocab = hf.get_vocab

        def __call__(self, *a, **kw):
            self.calls += 1
            raise AssertionError("tokenized")

    from frontend.http.chat import ChatTemplate
    from tests.fake_core import make_byte_tokenizer
    spy = Spy(ChatTemplate.load(make_byte_tokenizer(tmp_path / "tok")).tokenizer)
    with pytest.raises(Exception) as e:
        tokenize(Tokens(spy), {"prompt": "x" * 2048}, None, MAX_MODEL_LEN)
    assert e.value.status == 400 and e.value.param == "prompt", e.value
    assert "at least 158 tokens" in e.value.message and spy.calls == 0


def test_the_heap_trim_returns_freed_memory():
    """What server.py calls every reap: freed heap pages go back to the kernel (glibc)."""
    from frontend.http.malloc_trim import HeapTrim

    def rss_mb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))

    blocks = [bytearray(64 << 10) for _ in range(3000)]   # ~190 MB, under mmap's threshold
    kept = blocks[::50]   # pins the heap's top: glibc alone gives nothing back
    del blocks
    before = rss_mb()
    HeapTrim()()
    assert before - rss_mb() > 100, (before, rss_mb())
    assert len(kept) == 60
