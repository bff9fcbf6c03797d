"""`python -m frontend` as a real process against the scripted fake core.

One frontend process and one fake core serve the whole module. The fake core echoes the
prompt's bytes then EOS; "hang..." prompts never produce, "slow..." ones produce one token
per 0.1 s, "reject..." ones are refused with 429.
"""
from __future__ import annotations

import gc

import msgpack
import pytest

from core.ipc.protocol import (Abort, AddRequest, CoreStats, Delta, ErrorReply, Generate, I32, WIRE,
                           Ping, Pong, Rejected, StepEvents, encode)
from frontend.client import Client, ClientError
from worker.preset_tokenizer import NUM_FIXED
from tests.fake_core import EOS, MAX_MODEL_LEN, VOCAB, RawClient, running_engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("frontend")) as e:
        yield e


@pytest.fixture
def client(engine):
    with Client(engine.address, timeout=10) as c:
        yield c


@pytest.fixture
def raw(engine):
    r = RawClient(engine.address)
    yield r
    r.close()


# ---------------------------------------------------------------- outputs

def test_generate_echoes_and_keeps_eos_out_of_text(client):
    r = client.generate("hello", max_tokens=50)
    assert r.text == "hello" and r.finish_reason == "stop"
    assert r.token_ids == list(b"hello") + [EOS]
    assert r.prompt_token_ids == list(b"hello")


def test_length_and_ignore_eos(client):
    assert client.generate("hello", max_tokens=3).finish_reason == "length"
    r = client.generate("hi", max_tokens=5, ignore_eos=True)
    assert r.token_ids == [104, 105, EOS, 104, 105] and r.finish_reason == "length"


def test_token_id_prompt_used_as_is(client):
    r = client.generate([72, 105], max_tokens=10)
    assert r.prompt_token_ids == [72, 105] and r.text == "Hi"


def test_stream_concatenates_to_generate(client):
    prompt = "stream me, please"
    deltas = list(client.stream(prompt, max_tokens=100))
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].finish_reason == "stop"
    assert deltas[0].prompt_token_ids == list(prompt.encode())
    assert all(d.prompt_token_ids is None for d in deltas[1:])
    r = client.generate(prompt, max_tokens=100)
    assert "".join(d.text for d in deltas) == r.text == prompt
    assert [t for d in deltas for t in d.token_ids] == r.token_ids


def test_multibyte_characters_arrive_whole(client):
    prompt = "é€😀 ok"
    deltas = list(client.stream(prompt, max_tokens=100))
    assert all("\ufffd" not in d.text for d in deltas)
    assert "".join(d.text for d in deltas) == prompt
    assert sum(1 for d in deltas if d.token_ids and not d.text) >= 6  # held-back bytes


# ---------------------------------------------------------------- stop strings and aborts

def test_stop_string_cuts_and_stops_at_the_core(engine, client):
    r = client.generate("hello world and more", max_tokens=100, stop="world",
                        request_id="stop-1")
    assert r.text == "hello " and r.finish_reason == "stop"
    assert r.token_ids == list(b"hello world")   # up to the token completing the stop
    stop = engine.core.stop_of(engine.fid("stop-1"))
    assert stop is not None and stop.num_tokens == len(b"hello world")
    assert r.metrics["queue_ms"] == 0.0 and r.metrics["e2e_ms"] >= r.metrics["ttft_ms"]


def test_earliest_of_several_stops_wins(client):
    r = client.generate("hello world", max_tokens=100, stop=["zzz", "lo w"])
    assert r.text == "hel" and r.finish_reason == "stop"
    assert client.generate("hello", max_tokens=100, stop=["zz"]).text == "hello"


def test_possible_stop_text_is_held_back(client):
    deltas = list(client.stream("abcabd", max_tokens=100, stop=["abd"]))
    assert [d.text for d in deltas if d.text] == ["abc"]
    assert deltas[-1].finish_reason == "stop"


def test_abort_ends_the_stream(engine, client):
    s = client.stream("slow abcdefgh", max_tokens=100, request_id="abort-1")
    first = next(s)
    client.abort("abort-1")
    rest = list(s)
    assert rest[-1].finish_reason == "abort"
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) < 13
    assert engine.core.abort_of(engine.fid("abort-1")) is not None


def test_abandoned_stream_sends_abort(engine, client):
    s = client.stream("slow abcdefgh", max_tokens=100, request_id="leave-1")
    next(s)
    s.close()
    assert engine.core.abort_of(engine.fid("leave-1")) is not None
    s = client.stream("slow abcdefgh", max_tokens=100, request_id="leave-2")
    next(s)
    del s
    gc.collect()
    assert engine.core.abort_of(engine.fid("leave-2")) is not None
    assert client.generate("after").text == "after"


def test_client_that_disappears_is_aborted(engine):
    r = RawClient(engine.address)
    r.send_msg(Generate("gone-1", "hang on", wire=WIRE))
    fid = engine.fid("gone-1")
    r.close()
    assert engine.core.abort_of(fid, timeout=5) is not None


def test_client_timeout_is_503_and_aborts(engine):
    with Client(engine.address, timeout=0.5) as c:
        with pytest.raises(ClientError) as e:
            c.generate("hang please", request_id="slow-1")
    assert e.value.code == 503
    assert engine.core.abort_of(engine.fid("slow-1")) is not None


# ---------------------------------------------------------------- errors

BAD = [
    dict(prompt=""), dict(prompt=[]), dict(prompt=[-1]), dict(prompt=[VOCAB]),
    dict(max_tokens=0), dict(temperature=-0.5), dict(temperature=float("nan")),
    dict(temperature=float("inf")), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
    dict(priority=1001), dict(priority=-1001), dict(seed=-1), dict(seed=2 ** 63),
    dict(stop=[""]), dict(stop=["ok", ""]), dict(request_id=""),
    dict(prompt="x" * MAX_MODEL_LEN), dict(prompt=[65] * (MAX_MODEL_LEN + 5)),
    dict(temperature="hot"), dict(max_tokens=1.5), dict(stop=[1]), dict(ignore_eos="yes"),
]


@pytest.mark.parametrize("bad", BAD, ids=[repr(b)[:40] for b in BAD])
def test_bad_requests_are_400(client, bad):
    with pytest.raises(ClientError) as e:
        client.generate(**{"prompt": "ok", **bad})
    assert e.value.code == 400, e.value.message


def test_longest_prompt_accepted(client):
    r = client.generate("x" * (MAX_MODEL_LEN - 1), max_tokens=1)
    assert r.finish_reason == "length"


def test_unknown_field_and_wrong_type_name_the_request(raw):
    raw.send(msgpack.packb({"t": "generate", "request_id": "u1", "prompt": "hi", "bogus": 1}))
    raw.send(msgpack.packb({"t": "generate", "request_id": "u2", "prompt": "hi",
                            "max_tokens": "many"}))
    replies = [raw.recv(), raw.recv()]
    assert [(r.request_id, r.code) for r in replies] == [("u1", 400), ("u2", 400)]


def test_oversized_frame_is_413(client, raw):
    with pytest.raises(ClientError) as e:
        client.generate([EOS] * 1_000_000, request_id="big-1")  # a 3 MB frame
    assert e.value.code == 413
    raw.send(b"\x00" * (3 << 20))
    reply = raw.recv()
    assert isinstance(reply, ErrorReply) and reply.code == 413 and reply.request_id is None
    assert client.generate("small").text == "small"


def test_queue_full_passes_through_as_429(client):
    with pytest.raises(ClientError) as e:
        client.generate("reject me")
    assert e.value.code == 429


def test_garbage_frames_are_answered_and_the_next_request_served(raw):
    junk = [
        (b"",), (b"\xc1",), (msgpack.packb([1, 2, 3]),), (msgpack.packb({"t": "nope"}),),
        (msgpack.packb({"t": "generate"}),), (msgpack.packb({1: 2}),),
        (msgpack.packb({"t": "generate", "request_id": 5, "prompt": "x"}),),
        (encode(Delta("x", "", [])),), (b"a", b"b"), (b"\x91",),
    ]
    for frames in junk:
        raw.send(*frames)
    replies = [raw.recv() for _ in junk]
    assert all(isinstance(r, ErrorReply) and r.code == 400 for r in replies), replies
    raw.send_msg(Generate("after-junk", "fine", max_tokens=20, wire=WIRE))
    deltas = []
    while not deltas or deltas[-1].finish_reason is None:
        deltas.append(raw.recv())
    assert "".join(d.text for d in deltas) == "fine"


def test_duplicate_request_id_is_400(engine, raw, client):
    raw.send_msg(Generate("dup", "hang here", wire=WIRE))
    raw.send_msg(Generate("dup", "hang here", wire=WIRE))
    reply = raw.recv()
    assert isinstance(reply, ErrorReply) and (reply.request_id, reply.code) == ("dup", 400)
    raw.send_msg(Abort("dup"))
    end = raw.recv()
    assert isinstance(end, Delta) and end.finish_reason == "abort"
    s = client.stream("slow abc", request_id="dup-2")
    next(s)
    with pytest.raises(ClientError) as e:
        next(client.stream("other", request_id="dup-2"))
    assert e.value.code == 400
    assert "".join(d.text for d in s).endswith("c")


def test_junk_from_the_core_is_dropped(engine, client):
    for frame in (b"junk", msgpack.packb({"t": "events", "fids": b"\x01", "tokens": b"",
                                          "finished": []}),
                  encode(StepEvents(I32([1, 2]), I32([5]), [])),
                  encode(StepEvents(I32([10 ** 6]), I32([5]), [[10 ** 6, "stop"]])),
                  encode(Rejected(10 ** 6, 429, "x")), encode(CoreStats(10 ** 6, {})),
                  encode(AddRequest(0, "x", I32([1]), 1, 0, None))):
        engine.core.inject(frame)
    assert client.generate("still here").text == "still here"
    assert "bad frame from the core" in engine.fe.stderr()


# ---------------------------------------------------------------- stats and ping

def test_stats(engine, client):
    s = client.stats()
    for key in ("running", "waiting", "free_blocks", "total_blocks", "steps", "max_model_len"):
        assert key in s
    assert s["max_model_len"] == MAX_MODEL_LEN
    assert s["pids"]["frontend"] == engine.fe.proc.pid


def test_ping(raw):
    raw.send_msg(Ping())
    assert isinstance(raw.recv(skip=()), Pong)


def test_skip_special_tokens_is_per_request(client):
    ids = [104, NUM_FIXED - 2, 105]     # h, <|im_start|>, i
    assert client.generate(ids, max_tokens=10).text == "hi"
    assert client.generate(ids, max_tokens=10, skip_special_tokens=False).text == "h<|im_start|>i"



def test_a_client_of_the_old_wire_gets_a_400_naming_wire(raw):
    """A Generate without `wire` (what clients sent before Deltas frames) is wire 1: the
    client hears why at once instead of dropping frames it cannot read."""
    raw.send(msgpack.packb({"t": "generate", "request_id": "old-1", "prompt": "hi"}))
    raw.send_msg(Generate("old-2", "hi", wire=WIRE + 1))
    for rid in ("old-1", "old-2"):
        reply = raw.recv()
        assert isinstance(reply, ErrorReply), reply
        assert (reply.request_id, reply.code, reply.param) == (rid, 400, "wire")
        assert f"wire {WIRE}" in reply.message
    raw.send_msg(Generate("new-1", "hi", max_tokens=2, wire=WIRE))   # still serving
    reply = raw.recv()
    while isinstance(reply, Delta) and reply.finish_reason is None:
        reply = raw.recv()
    assert isinstance(reply, Delta) and reply.finish_reason == "length", reply
