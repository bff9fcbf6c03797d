"""Typed but extreme values in every field of a request, through ZMQ (raw Generate frames)
and through HTTP (/v1/completions, /v1/chat/completions): every reply is a normal answer
or an error with code 400, 413 or 429, and afterwards every process of the group is the
same one, alive, and the engine still serves.

One group (test_hostile.py's flags, so conftest.py shares it) and one gateway for the
module. A request the engine accepts is aborted after its first delta (HTTP: the connection
is closed after the first event), so an accepted max_tokens of 2**31 - 1 costs no more
than 1.
"""
from __future__ import annotations

import functools
import http.client
import itertools
import json
import math
import os
import socket
import time
from urllib.parse import urlsplit

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.ipc.protocol import WIRE
from frontend.client import Client
from tests.frontend.test_http import start_gateway, stop_gateway

from tests.group.test_hostile import GROUP_ARGS   # the same group serves both modules
REPLY_TIMEOUT_S = 60
BODY_TIMEOUT_S = 0.5
ALLOWED_ERRORS = {400, 413, 429}
EXAMPLES = settings(max_examples=50, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

HUGE = 900_000  # characters: a string under the 1 MiB frame limit
EXTREME_INTS = [0, 1, -1, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 32, 2 ** 63 - 1,
                2 ** 63, -2 ** 63, 2 ** 64 - 1]
EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e-7, 1e-6, 1.0000001, 1e4, 1e4 + 1, 1e308,
                  -1e308, math.inf, -math.inf, math.nan]
EXTREME_STRINGS = ["", "x", "\x00", "\U0001f600", "s" * 256, "s" * 257, "x" * HUGE]
EXTREME_PROMPTS = EXTREME_STRINGS + [[], [0], [-1], [2 ** 31], [2 ** 64 - 1], [-2 ** 63],
                                     [1] * 100_000, [1] * 2048]
EXTREME_STOPS = [None, [], [""], ["s" * 257], ["s"] * 17, ["a"] * 10_000, ["x" * HUGE],
                 ["s" * 256] * 16, ["\U0001f600" * 256]]
EXTREMES = {"request_id": EXTREME_STRINGS, "prompt": EXTREME_PROMPTS,
            "max_tokens": EXTREME_INTS, "temperature": EXTREME_FLOATS,
            "top_p": EXTREME_FLOATS, "top_k": EXTREME_INTS, "seed": [None, *EXTREME_INTS],
            "stop": EXTREME_STOPS, "priority": EXTREME_INTS, "ignore_eos": [True, False],
            "prompt_logprobs": [None, *EXTREME_INTS]}
ORDINARY = {"request_id": st.text(min_size=1, max_size=20), "prompt": st.text(max_size=20)
            | st.lists(st.integers(-2 ** 63, 2 ** 64 - 1), max_size=8),
            "max_tokens": st.integers(-2 ** 63, 2 ** 64 - 1), "temperature": st.floats(),
            "top_p": st.floats(), "top_k": st.integers(-2 ** 63, 2 ** 64 - 1),
            "seed": st.none() | st.integers(-2 ** 63, 2 ** 64 - 1),
            "stop": st.none() | st.lists(st.text(max_size=8), max_size=4),
            "priority": st.integers(-2 ** 63, 2 ** 64 - 1), "ignore_eos": st.booleans(),
            "prompt_logprobs": st.none() | st.integers(-2 ** 63, 2 ** 64 - 1)}
# Two thirds extremes, one third ordinary values: the sweeps below try every extreme
# alone, hypothesis tries them together.
FIELDS = {k: st.sampled_from(v) | st.sampled_from(v) | ORDINARY[k] for k, v in EXTREMES.items()}

_ids = itertools.count()


@pytest.fixture(scope="module")
def pids(group) -> dict:
    with Client(group.address, timeout=60) as c:
        return dict(c.stats()["pids"])


@pytest.fixture(scope="module")
def gateway(group, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    proc, url = start_gateway(group.address, tmp, "--log-level", "INFO",
                              "--body-timeout", str(BODY_TIMEOUT_S))
    try:
        yield url, tmp / "http.stderr"
    finally:
        assert stop_gateway(proc) == 0


def assert_group_intact(address: str, pids: dict) -> None:
    with Client(address, timeout=60) as c:
        r = c.generate("still serving", max_tokens=3, ignore_eos=True)
        assert r.finish_reason == "length" and len(r.token_ids) == 3
        now = c.stats()["pids"]
    assert {k: now[k] for k in pids} == pids, (pids, now)  # nobody died and came back
    for name, pid in now.items():
        os.kill(pid, 0)  # raises if it is gone


# ------------------------------------------------------------------ ZMQ


def exchange(group, frame: bytes, request_id) -> list[dict]:
    """Send one Generate frame; the replies until the request ends (aborted after its
    first delta if it runs on)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(group.address)
    replies = []
    try:
        s.send(frame)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not s.poll(500):
                assert group.alive(), f"the group died: {group.tail()}"
                continue
            for reply in as_replies(msgpack.unpackb(s.recv(), raw=False)):
                replies.append(reply)
                if reply["t"] == "error" or reply.get("finish_reason") is not None:
                    return replies
                if len(replies) == 1:
                    s.send(msgpack.packb({"t": "abort", "request_id": request_id}))
        raise AssertionError(f"no end of request within {REPLY_TIMEOUT_S} s: {replies}")
    finally:
        s.close(0)
        ctx.term()


def as_replies(frame: dict) -> list[dict]:
    """A frame's replies as maps: a Deltas frame's one per delta ("t": "delta"), none for
    a heartbeat."""
    if frame["t"] == "pong":
        return []
    if frame["t"] != "deltas":
        return [frame]
    plain = [{"t": "delta", "request_id": rid, "finish_reason": None}
             for rid in frame["request_ids"]]
    return plain + [{"t": "delta", **d} for d in frame["full"]]


def generate_through_zmq(group, fields: dict) -> None:
    msg = {"t": "generate", "request_id": f"z{next(_ids)}", "prompt": "hi", "max_tokens": 2,
           "wire": WIRE, **fields}
    replies = exchange(group, msgpack.packb(msg), msg["request_id"])
    end = replies[-1]
    if end["t"] == "error":
        assert end["code"] in ALLOWED_ERRORS and end["message"], (fields, end)
    else:
        assert end["t"] == "delta" and end["finish_reason"] in ("stop", "length", "abort")


def test_every_extreme_value_through_zmq(group, pids):
    for field, values in EXTREMES.items():
        for value in values:
            generate_through_zmq(group, {field: value})


@EXAMPLES
@given(fields=st.fixed_dictionaries({}, optional=FIELDS))
def test_extreme_generate_frames(group, pids, fields):
    generate_through_zmq(group, fields)


def test_group_intact_after_zmq(group, pids):
    assert_group_intact(group.address, pids)


# ------------------------------------------------------------------ HTTP

NESTED = functools.reduce(lambda v, _: [v], range(40), 1)  # past the gateway's depth limit
JSON_EXTREMES = (EXTREME_INTS + [2 ** 64, -2 ** 63 - 1, 2 ** 70, -2 ** 70, 10 ** 100]
                 + [f for f in EXTREME_FLOATS if math.isfinite(f)] + EXTREME_STRINGS
                 + ["\ud800", "a\udfffb", True, None, [1] * 100_000, {"a": [1]}, NESTED])
HTTP_EXTREMES = {
    "prompt": EXTREME_PROMPTS + ["\ud800", ["x", "y"], [["x"]], [2 ** 64], [True]],
    **{k: JSON_EXTREMES for k in ("max_tokens", "temperature", "top_p", "top_k", "seed",
                                  "n", "ignore_eos")},
    "stop": EXTREME_STOPS + JSON_EXTREMES + [["\udc00"]]}
MESSAGES = [[{"role": "user", "content": "x" * HUGE}], [{"role": "user", "content": "\ud800"}],
            [{"role": "\udc00", "content": "hi"}], [{"role": "user", "content": "hi"}] * 5000,
            [{"role": "user", "content": [{"type": "text", "text": "hi"}] * 1000}], [], [{}],
            [{"role": "user", "content": NESTED}], "hi", None]
CHAT_EXTREMES = {"messages": MESSAGES, "max_completion_tokens": JSON_EXTREMES}
OTHERS = {k: st.sampled_from(JSON_EXTREMES) for k in ("model", "user", "logprobs", "best_of",
                                                      "echo", "suffix", "prompt_logprobs")}
HTTP_FIELDS = {**{k: st.sampled_from(v) for k, v in HTTP_EXTREMES.items()}, **OTHERS}
CHAT_FIELDS = {**HTTP_FIELDS, **{k: st.sampled_from(v) for k, v in CHAT_EXTREMES.items()}}
PRIORITY_HEADERS = [None, "1000", "-1000", "1001", "99999999999999999999", "1e3", " 5 ", "",
                    "\u0665"]


def post(url: str, path: str, body: bytes, priority: str | None) -> tuple[int, bytes]:
    """(status, the body or the first SSE event); a stream is closed after its first event,
    which aborts the request."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=REPLY_TIMEOUT_S)
    headers = {"Content-Type": "application/json"}
    if priority is not None:
        headers["X-TL-Priority"] = priority.encode("utf-8").decode("latin-1")
    try:
        conn.request("POST", path, body, headers)
        r = conn.getresponse()
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            return r.status, r.readline()
        return r.status, r.read()
    finally:
        conn.close()


def check_http_reply(status: int, data: bytes) -> None:
    if status == 200:
        assert data.startswith(b"data: {") or json.loads(data)["choices"], data[:200]
        return
    assert status in ALLOWED_ERRORS, (status, data[:300])
    assert json.loads(data)["error"]["code"] == status


def body_of(base: dict, fields: dict) -> bytes:
    # ensure_ascii spells lone surrogates as \\udXXX escapes, as a hostile client would
    return json.dumps({**base, **fields}).encode()


COMPLETION = ("/v1/completions", {"prompt": "hi", "max_tokens": 2})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 2})


def generate_through_http(url: str, route: tuple, fields: dict, priority=None) -> None:
    path, base = route
    status, data = post(url, path, body_of({"stream": True, **base}, fields), priority)
    check_http_reply(status, data)


def test_every_extreme_value_through_http(gateway):
    url, _ = gateway
    for route, extremes in ((COMPLETION, HTTP_EXTREMES), (CHAT, CHAT_EXTREMES)):
        for field, values in extremes.items():
            for value in values:
                generate_through_http(url, route, {field: value})
    for priority in PRIORITY_HEADERS:
        generate_through_http(url, COMPLETION, {}, priority)


@EXAMPLES
@given(fields=st.fixed_dictionaries({"stream": st.booleans()}, optional=HTTP_FIELDS),
       priority=st.sampled_from(PRIORITY_HEADERS))
def test_extreme_completion_bodies(gateway, fields, priority):
    generate_through_http(gateway[0], COMPLETION, fields, priority)


@EXAMPLES
@given(fields=st.fixed_dictionaries({"stream": st.booleans()}, optional=CHAT_FIELDS),
       priority=st.sampled_from(PRIORITY_HEADERS))
def test_extreme_chat_bodies(gateway, fields, priority):
    fields.pop("prompt", None)
    generate_through_http(gateway[0], CHAT, fields, priority)


def raw_request(url: str, data: bytes, wait: float) -> bytes:
    """Send raw bytes to the gateway; what comes back within `wait` s, up to the end of
    an error body (the connection's close is tested in test_http_hostile.py)."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=wait) as sock:
        sock.sendall(data)
        out = b""
        try:
            while not out.endswith(b"}}") and (chunk := sock.recv(65536)):
                out += chunk
        except TimeoutError:
            pass
        return out


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize("data", [HEAD + b"Content-Length: 99\r\n\r\n{\"prompt\"",
                                  HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\n{\"p\r\n"],
                         ids=["content-length past the body", "chunked without an end"])
def test_a_body_that_never_ends_gets_408(gateway, data):
    start = time.monotonic()
    reply = raw_request(gateway[0], data, wait=15)
    assert reply.startswith(b"HTTP/1.1 408") and b"Connection: close" in reply, reply
    assert time.monotonic() - start < BODY_TIMEOUT_S + 3


def test_disconnects_leave_one_info_line_each(gateway):
    url, log = gateway
    before = log.read_text().count("the client disconnected")
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port)) as sock:  # mid-body
        sock.sendall(HEAD + b"Content-Length: 99\r\n\r\n{\"prompt\"")
        # a client that stalls mid-body, then leaves: the stall is the scenario (nothing
        # outside the gateway shows it reading; test_http_hostile.py waits on its state)
        time.sleep(0.3)
    body = json.dumps({"prompt": "x", "max_tokens": 500, "ignore_eos": True, "stream": True})
    with socket.create_connection((u.hostname, u.port)) as sock:  # mid-stream
        sock.sendall(HEAD + f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    while log.read_text().count("the client disconnected") < before + 2:
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)


def test_group_intact_after_http(group, pids, gateway):
    assert_group_intact(group.address, pids)
    log = gateway[1].read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
