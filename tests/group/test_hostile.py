"""Hostile input and misbehaving clients: fuzzed frames, vanishing clients, abort storms,
aborts racing finishes, duplicate ids. Nothing dies, nothing is stuck, nothing leaks.

The fuzz counts are small in the default suite; the slow suite runs 10,000 frames.
"""
from __future__ import annotations

import random
import sqlite3
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import protocol as P
from frontend.client import Client, ClientError
from tests.waiting import poll, wait_until

GROUP_ARGS = ["--num-blocks", "64", "--max-seqs", "16"]


def valid_frames() -> list[bytes]:
    return [P.encode(m) for m in (
        P.Generate(request_id="f", prompt="hello", max_tokens=3, stop=["x"], wire=P.WIRE),
        P.Generate(request_id="g", prompt=[1, 2, 3], max_tokens=2, temperature=0.5, seed=3,
                   wire=P.WIRE),
        P.Abort(request_id="f"), P.Stats(), P.Ping(),
        P.AddRequest(fid=1, request_id="x", prompt=P.I32([1, 2]), max_tokens=2,
                     priority=0, sampling=P.SamplingParams()),
        P.StepEvents(fids=P.I32([1]), tokens=P.I32([2]), finished=[[1, "stop"]]))]


def mutate(rng: random.Random, frame: bytes) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            b[rng.randrange(len(b) + 1):0] = rng.randbytes(rng.randint(1, 8))
        else:
            b += msgpack.packb({rng.choice(["t", "prompt", "zz"]): rng.choice([1, "a", [], None])})
    return bytes(b)


def frames(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    base = valid_frames()
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(rng.randbytes(rng.randint(0, 64)))
        else:
            out.append(mutate(rng, rng.choice(base)))
    return out


# ---------------------------------------------------------------- the decoder alone

@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=200),
                 st.builds(lambda i, s: mutate(random.Random(s), valid_frames()[i]),
                           st.integers(0, 6), st.integers(0, 2**32))))
def test_decoder_answers_every_frame_with_a_message_or_protocol_error(data):
    try:
        P.decode(data)
    except P.ProtocolError as e:
        assert e.code in (400, 413) and e.message


@pytest.mark.slow
def test_decoder_fuzz_10000():
    for f in frames(10_000, 99):
        try:
            P.decode(f)
        except P.ProtocolError:
            pass


# ---------------------------------------------------------------- the frontend socket

def fuzz_socket(address: str, n: int, seed: int) -> int:
    """Send n fuzzed frames; returns how many error replies came back."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(address)
    errors = 0
    try:
        for i, f in enumerate(frames(n, seed)):
            s.send_multipart([f] if i % 50 else [f, b"extra"])
            while s.poll(0):
                errors += msgpack.unpackb(s.recv(), raw=False).get("t") == "error"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and s.poll(500):
            errors += msgpack.unpackb(s.recv(), raw=False).get("t") == "error"
    finally:
        s.close(0)
        ctx.term()
    return errors


def idle(st: dict) -> bool:
    return (st["running"], st["waiting"]) == (0, 0) and st["free_blocks"] == st["total_blocks"]


def assert_healthy(address: str) -> None:
    with Client(address, timeout=60) as c:
        r = c.generate("still serving", max_tokens=4, ignore_eos=True)
        assert r.finish_reason == "length" and len(r.token_ids) == 4
        wait_until(lambda: idle(c.stats()), timeout=15, what="no request left, every block free")


def test_frontend_fuzz_1000_frames(group):
    errors = fuzz_socket(group.address, 1000, 1)
    assert errors > 300
    assert_healthy(group.address)
    assert group.alive()


@pytest.mark.slow
def test_frontend_fuzz_10000_frames(group):
    fuzz_socket(group.address, 10_000, 2)
    assert_healthy(group.address)
    assert group.alive()


def test_a_17_mb_frame_gets_413(group):
    with Client(group.address, timeout=60) as c:
        with pytest.raises(ClientError) as e:
            c.generate("x" * (17 << 20), max_tokens=1, request_id="huge")
        assert e.value.code == 413
        assert c.generate("after", max_tokens=2).finish_reason is not None


# ---------------------------------------------------------------- misbehaving clients

def wait_aborted(log, pattern: str, n: int, timeout: float) -> bool:
    """True once the live step log shows n requests matching `pattern` aborted."""
    def aborted() -> int:
        with sqlite3.connect(log) as conn:
            return conn.execute("SELECT count(*) FROM requests WHERE client_request_id LIKE ?"
                                " AND finish_reason='abort'", (pattern,)).fetchone()[0]
    return bool(poll(lambda: aborted() == n, timeout, every=0.2))


def test_vanishing_clients_and_abort_storms_leave_nothing_stuck(group):
    rng = random.Random(5)
    ctx = zmq.Context()
    socks = []
    try:
        # clients that vanish mid-stream: raw sockets closed without Abort. All connect
        # first and send together: a request sent while the others still connect could
        # finish its 900 tokens (~1.5 s on tiny) before the last one arrives
        for i in range(12):
            socks.append(ctx.socket(zmq.DEALER))
            socks[-1].connect(group.address)
        for i, s in enumerate(socks):
            s.send(P.encode(P.Generate(request_id=f"v{i}", prompt=[1, 2, 3, i],
                                       max_tokens=900, ignore_eos=True, wire=P.WIRE)))
        with Client(group.address, timeout=60) as c:   # the core holds all 12 when they vanish
            wait_until(lambda: (now := c.stats())["running"] + now["waiting"] >= 12,
                       timeout=25, what="the 12 requests in the core")
    finally:
        # closed even when the wait fails: a context left open blocks in its finalizer
        # (term waits for its sockets) and hangs whatever test collects it
        for s in socks:
            s.close(0)
        ctx.term()
    assert wait_aborted(group.log, "v%", 12, timeout=25)  # 5x the 5 s target
    with Client(group.address, timeout=60) as c:
        # an abort storm over live, finished and unknown ids, racing finishes
        streams = [c.stream([7, i], max_tokens=rng.randint(1, 6), ignore_eos=True,
                            request_id=f"s{i}") for i in range(20)]
        firsts = [next(s) for s in streams[:10]]
        for i in range(200):
            c.abort(f"s{rng.randrange(25)}")
        for s in streams[:10]:
            for _ in s:
                pass
        assert all(f.request_id.startswith("s") for f in firsts)
        # duplicate ids among unfinished requests are refused, the first goes on
        it = c.stream([1, 2], max_tokens=50, ignore_eos=True, request_id="dup")
        next(it)
        with pytest.raises(ClientError) as e:
            c.generate([1, 2], max_tokens=2, request_id="dup")
        assert e.value.code == 400
        assert list(it)[-1].finish_reason == "length"
    assert_healthy(group.address)


def test_many_clients_racing_aborts_and_finishes(group):
    def worker(k):
        rng = random.Random(k)
        with Client(group.address, timeout=60) as c:
            for j in range(8):
                request_id = f"r{k}-{j}"
                it = c.stream([k, j, 3], max_tokens=rng.randint(1, 8), ignore_eos=True,
                              request_id=request_id)
                for n, d in enumerate(it):
                    if n == rng.randint(0, 3):
                        c.abort(request_id)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert_healthy(group.address)


# ---------------------------------------------------------------- identity and odd values

def test_a_connection_claiming_a_clients_routing_id_gets_nothing_of_its_stream(group):
    """The frontend's ROUTER keeps a request's replies with the connection that sent it: a
    second DEALER that connects with the victim's routing id (printed in logs before) gets
    none of the victim's tokens, and the victim gets every one."""
    ctx = zmq.Context()
    thief = ctx.socket(zmq.DEALER)
    with Client(group.address, timeout=60) as victim:
        stream = victim.stream("steal me", max_tokens=400, ignore_eos=True)
        first = next(stream)
        thief.setsockopt(zmq.ROUTING_ID, victim._sock.getsockopt(zmq.ROUTING_ID))
        thief.setsockopt(zmq.LINGER, 0)
        thief.connect(group.address)
        time.sleep(0.3)   # the connection is made while the victim's stream runs
        rest = list(stream)
        stolen = thief.poll(500)
    thief.close(0)
    ctx.term()
    assert not stolen, "the second connection received the victim's frames"
    assert sum(len(d.token_ids) for d in [first, *rest]) == 400


NESTED = "@nested-1000@"   # stands for a map nested 1,000 deep, spliced in as raw msgpack


def raw_frame(field: str, value) -> bytes:
    """A Generate frame with `field` = value; NESTED in it becomes {"a": {"a": ... nil}}
    1,000 deep, written byte by byte (msgpack's packer refuses to nest past 512)."""
    frame = P.encode(P.Generate(request_id="odd", prompt="hi", max_tokens=2, wire=P.WIRE,
                                **{field: value}))
    deep = b"\x81\xa1a" * 1000 + b"\xc0"
    return frame.replace(msgpack.packb(NESTED), deep)


@pytest.mark.parametrize("field,value,words", [
    ("response_format", {"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"a": b"bytes"}}}, "bytes"),
    ("structured_outputs", {"json": {b"k": 1, "k": 2}}, "key is not a string"),
    ("structured_outputs", {"json": NESTED}, "deeper than 64"),
])
def test_malformed_structured_fields_get_a_400_naming_the_field(group, field, value, words):
    """Raw frames carrying what JSON cannot (bytes, a bytes key beside string keys) or a
    schema nested 1,000 deep: a 400 naming the field, and the frontend serves on."""
    frame = raw_frame(field, value)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(group.address)
    try:
        sock.send(frame)
        assert sock.poll(10_000), "no reply"
        reply = P.decode(sock.recv())
    finally:
        sock.close(0)
        ctx.term()
    assert isinstance(reply, P.ErrorReply) and reply.code == 400, reply
    assert field in reply.message and words in reply.message, reply.message
    assert_healthy(group.address)
