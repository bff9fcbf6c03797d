"""The OpenAI-compatible gateway (python -m frontend.http) against a real group on `tiny`.

The official `openai` package is the client; replies must equal what Client.generate gives
for the same request. One seat (--max-seqs 1) and a short queue (--max-waiting 4) make the
priority and 429 checks deterministic: everything waits behind one long request.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

from frontend.client import AsyncClient, Client
from scripts import ROOT
from tests.waiting import wait_until

GROUP_ARGS = ["--max-seqs", "1", "--max-waiting", "4"]
CHATML = "<|im_start|>{}\n{}<|im_end|>\n"


# ------------------------------------------------------------------ helpers (shared)


def start_gateway(frontend: str, tmp: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`python -m frontend.http` on a free port; returns it and its URL once READY."""
    err = (tmp / "http.stderr").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "frontend.http", "--frontend", frontend,
                             "--port", "0", "--startup-timeout", "60", *extra],
                            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"gateway did not start: {(tmp / 'http.stderr').read_text()}")
    return proc, line.split()[1]


def stop_gateway(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def http(method: str, url: str, body=None, headers=None, timeout: float = 60):
    """(status, headers, parsed JSON or text); `body` a dict (sent as JSON) or raw bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read()
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode()


def assert_openai_error(body, status: int) -> None:
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == status and body["error"]["message"]


def wait_idle(address: str, timeout: float = 20.0) -> dict:
    """stats() once nothing runs or waits and every block is free again."""
    deadline = time.monotonic() + timeout
    with Client(address, timeout=10) as c:
        while True:
            s = c.stats()
            if (s["running"], s["waiting"], s["free_blocks"]) == (0, 0, s["total_blocks"]):
                return s
            assert time.monotonic() < deadline, s
            time.sleep(0.05)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def gateway(group, tmp_path_factory):
    proc, url = start_gateway(group.address, tmp_path_factory.mktemp("http"))
    try:
        yield url
    finally:
        assert stop_gateway(proc) == 0


@pytest.fixture(scope="module")
def oai(gateway):
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def engine(group):
    with Client(group.address, timeout=60) as c:
        yield c


# ------------------------------------------------------------------ equality with Client

CASES = [
    {"prompt": "Hello, world", "max_tokens": 12, "temperature": 0.0},
    {"prompt": [5, 17, 99, 200, 3], "max_tokens": 9, "temperature": 0.0},
    {"prompt": "sampled", "max_tokens": 10, "temperature": 0.9, "top_p": 0.8, "seed": 1234},
    {"prompt": "stops", "max_tokens": 24, "temperature": 0.0, "stop": ["a", "e"]},
]


@pytest.mark.parametrize("case", CASES, ids=["text", "token-ids", "seeded", "stop"])
def test_completion_equals_client_generate(oai, engine, case):
    want = engine.generate(**case)
    got = oai.completions.create(model="tiny", **case)
    assert got.object == "text_completion" and got.model == "tiny"
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    assert got.usage.completion_tokens == len(want.token_ids)
    assert got.usage.total_tokens == len(want.prompt_token_ids) + len(want.token_ids)

    *chunks, last = oai.completions.create(model="tiny", stream=True,
                                           stream_options={"include_usage": True}, **case)
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert [c.choices[0].finish_reason for c in chunks][-1] == want.finish_reason
    assert all(c.choices[0].finish_reason is None and c.usage is None for c in chunks[:-1])
    assert last.choices == [] and last.usage.model_dump() == got.usage.model_dump()


def test_chat_renders_the_template_and_equals_client_generate(oai, engine):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi there"}]
    prompt = "".join(CHATML.format(m["role"], m["content"]) for m in messages)
    want = engine.generate(prompt + "<|im_start|>assistant\n", max_tokens=10)

    got = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                      temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    assert got.usage.completion_tokens == len(want.token_ids)

    *chunks, last = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True})
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    assert last.choices == [] and last.usage.model_dump() == got.usage.model_dump()


def test_models_lists_the_served_model(oai, gateway):
    assert [m.id for m in oai.models.list()] == ["tiny"]
    assert http("GET", gateway + "/health")[0] == 200


# ------------------------------------------------------------------ errors

BAD = [
    ("not json", b"{prompt: 1", {}),
    ("not an object", b"[1, 2]", {}),
    ("prompt type", {"prompt": 5}, {}),
    ("mixed batch", {"prompt": ["a", [1]]}, {}),
    ("max_tokens type", {"prompt": "x", "max_tokens": "5"}, {}),
    ("temperature type", {"prompt": "x", "temperature": "hot"}, {}),
    ("stream type", {"prompt": "x", "stream": "yes"}, {}),
    ("stop type", {"prompt": "x", "stop": [1]}, {}),
    ("n=17", {"prompt": "x", "n": 17}, {}),
    ("logprobs 21", {"prompt": "x", "logprobs": 21}, {}),
    ("unknown field", {"prompt": "x", "temprature": 0.5}, {}),
    ("top_p range", {"prompt": "x", "top_p": 5}, {}),
    ("max_tokens range", {"prompt": "x", "max_tokens": 0}, {}),
    ("empty prompt", {"prompt": ""}, {}),
    ("priority word", {"prompt": "x"}, {"X-TL-Priority": "high"}),
    ("priority range", {"prompt": "x"}, {"X-TL-Priority": "1001"}),
    ("priority float", {"prompt": "x"}, {"X-TL-Priority": "1.5"}),
    ("body priority range beside the header", {"prompt": "x", "priority": 99999},
     {"X-TL-Priority": "3"}),
]


@pytest.mark.parametrize("body,headers", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_requests_get_400_in_openai_format(gateway, body, headers):
    status, _, reply = http("POST", gateway + "/v1/completions", body, headers)
    assert status == 400, reply
    assert_openai_error(reply, 400)
    assert reply["error"]["type"] == "invalid_request_error"


def test_bad_chat_and_unknown_route(gateway, oai):
    for body in ({"messages": []}, {"messages": [{"role": "user"}]},
                 {"messages": "hi"}, {"messages": [{"role": "user", "content": "x"}], "n": 17}):
        status, _, reply = http("POST", gateway + "/v1/chat/completions", body)
        assert status == 400, (body, reply)
        assert_openai_error(reply, 400)
    status, _, reply = http("GET", gateway + "/v1/nothing")
    assert status == 404
    assert_openai_error(reply, 404)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="tiny", prompt="x", n=0)


# ------------------------------------------------------------------ priority, 429, disconnect


async def _queue_scenario(url: str, address: str) -> dict:
    """One long request holds the seat; 3 low-priority requests wait, then a high one; the
    queue is then full, so one more gets 429. Dropping the long stream frees the seat."""
    done = {}
    async with aiohttp.ClientSession() as s, AsyncClient(address, timeout=10) as c:
        async def post(prio: int, key: str):
            async with s.post(url + "/v1/completions", headers={"X-TL-Priority": str(prio)},
                              json={"prompt": "queued", "max_tokens": 3,
                                    "temperature": 0}) as r:
                done[key] = (r.status, await r.json())

        async def waiting(n: int):
            while (await c.stats())["waiting"] != n:
                await asyncio.sleep(0.02)

        long = await s.post(url + "/v1/completions", json={
            "prompt": "long", "max_tokens": 2040, "ignore_eos": True, "stream": True})
        await long.content.readline()  # the first chunk: the long request runs
        tasks = [asyncio.create_task(post(-1, f"low{i}")) for i in range(3)]
        await asyncio.wait_for(waiting(3), 20)
        tasks.append(asyncio.create_task(post(100, "high")))
        await asyncio.wait_for(waiting(4), 20)
        async with s.post(url + "/v1/completions", json={"prompt": "one too many"}) as r:
            done["full"] = (r.status, await r.json(), r.headers.get("Retry-After"))
        long.close()  # the client disconnects mid-stream
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return done


def admissions(log: Path) -> dict[int, int]:
    """Request id -> the step of its first prefill chunk (start 0)."""
    first: dict[int, int] = {}
    with sqlite3.connect(f"file:{log}?mode=ro", uri=True) as conn:
        for step, sched in conn.execute("SELECT step, schedule FROM steps ORDER BY step"):
            for seq_id, start, _, _ in json.loads(sched)["prefill"]:
                if start == 0:
                    first.setdefault(seq_id, step)
    return first


def test_priority_header_overtakes_the_queue_and_a_full_queue_gets_429(group, gateway):
    done = asyncio.run(_queue_scenario(gateway, group.address))
    status, body, retry_after = done["full"]
    assert status == 429 and retry_after is not None and int(retry_after) >= 1
    assert_openai_error(body, 429)
    assert all(done[k][0] == 200 for k in ("low0", "low1", "low2", "high")), done
    wait_idle(group.address)

    def finished() -> list | None:   # the log's writer commits behind the step loop
        with sqlite3.connect(f"file:{group.log}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT id, priority, arrival_step, finish_reason FROM "
                                "requests WHERE priority IN (-1, 100) OR max_tokens = 2040"
                                ).fetchall()
        return rows if len(rows) == 5 and all(r[3] is not None for r in rows) else None
    rows = wait_until(finished, 30, "the five finishes in the log")
    admitted = admissions(group.log)
    high = [r for r in rows if r[1] == 100]
    low = [r for r in rows if r[1] == -1]
    long = [r for r in rows if r[1] == 0]
    assert len(high) == 1 and len(low) == 3 and len(long) == 1, rows
    assert long[0][3] == "abort"  # the disconnect aborted it
    assert all(high[0][2] > r[2] for r in low)                       # it came last
    assert all(admitted[high[0][0]] < admitted[r[0]] for r in low)   # and ran first


def test_disconnect_mid_stream_aborts_and_frees_the_blocks(oai, group):
    total = wait_idle(group.address)["total_blocks"]
    stream = oai.completions.create(model="tiny", prompt="x" * 100, max_tokens=1500,
                                    stream=True, extra_body={"ignore_eos": True})
    for _, _ in zip(range(3), stream):
        pass
    with Client(group.address) as c:
        assert c.stats()["free_blocks"] < total
    stream.close()
    assert wait_idle(group.address)["free_blocks"] == total


async def _drop_mid_stream(url: str, max_tokens: int, reset: bool) -> None:
    """POST a streamed completion on a raw socket, read up to its first event, then leave:
    a reset (RST) or a plain close (FIN)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"prompt": "gone", "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await asyncio.wait_for(reader.readuntil(b"data: "), 30)
    if reset:
        writer.transport.abort()
    else:
        writer.close()


def test_every_disconnect_mid_stream_aborts_its_request(group, gateway):
    """Ten clients leave mid-stream in turn; each request is aborted then, not run to its
    end. (A cancel swallowed by asyncio.wait_for once the next token was queued let about
    one in ten run on: tests/frontend/test_client_async.py pins that race down.)"""
    wait_idle(group.address)
    mine = range(1901, 1911)
    for max_tokens in mine:
        asyncio.run(_drop_mid_stream(gateway, max_tokens, reset=max_tokens % 2 == 0))
        wait_idle(group.address, timeout=60)

    def finished() -> list | None:   # the log's writer commits behind the step loop
        with sqlite3.connect(f"file:{group.log}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT max_tokens, finish_reason, json_array_length("
                                "output_tokens) FROM requests WHERE max_tokens BETWEEN 1901"
                                " AND 1910 AND finish_reason IS NOT NULL").fetchall()
        return rows if len(rows) == len(mine) else None
    rows = wait_until(finished, 30, "the ten finishes in the log")
    assert sorted(r[0] for r in rows) == list(mine), rows
    assert all(r[1] == "abort" and r[2] < r[0] for r in rows), rows


# ------------------------------------------------------------------ engine-side endings (no group)


class ScriptedClient:
    """Stands in for AsyncClient: every stream yields `script` (Deltas, then maybe an error)."""

    def __init__(self, script):
        self.script = script

    async def _stream(self):
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item

    def stream(self, prompt, **kw):
        return self._stream()

    async def stats(self):
        return {"pids": {}}


def serve_scripted(script, *requests) -> list:
    """Run the app in-process on a ScriptedClient; (status, body text) per request."""
    from aiohttp.test_utils import TestClient, TestServer

    from frontend.http.app import Gateway, make_app
    from frontend.http.metrics import Metrics

    async def run():
        app = make_app(Gateway(ScriptedClient(script), "m", 64, None, Metrics(), 0))
        async with TestClient(TestServer(app)) as c:
            out = []
            for body in requests:
                r = await c.post("/v1/completions", json=body)
                out.append((r.status, await r.text()))
            return out
    return asyncio.run(run())


def sse_events(text: str) -> list[dict]:
    assert text.endswith("data: [DONE]\n\n"), text
    return [json.loads(e[len("data: "):]) for e in text.split("\n\n")
            if e.startswith("data: {")]


def test_engine_abort_and_mid_stream_errors_keep_openai_shapes():
    from core.ipc.protocol import Delta
    from frontend.client.common import ClientError
    first = Delta("r", "hi", [1], None, [7, 8])
    plain, streamed = serve_scripted([first, Delta("r", "", [], "abort")],
                                     {"prompt": "x"}, {"prompt": "x", "stream": True})
    assert plain[0] == 503
    assert_openai_error(json.loads(plain[1]), 503)
    assert streamed[0] == 200
    events = sse_events(streamed[1])
    assert events[0]["choices"][0]["text"] == "hi"
    assert_openai_error(events[-1], 503)

    (status, _), = serve_scripted([ClientError(429, "queue full")],
                                  {"prompt": "x", "stream": True})
    assert status == 429
    (status, text), = serve_scripted([first, ClientError(503, "core died")],
                                     {"prompt": "x", "stream": True})
    assert status == 200
    assert_openai_error(sse_events(text)[-1], 503)
