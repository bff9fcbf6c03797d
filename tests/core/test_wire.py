"""The wire codec's type checks (core/ipc/wire.py): worked out once per type, with a fast
path for lists of plain values; these pin that both paths accept and refuse the same."""
from __future__ import annotations

import msgpack
import pytest

from core.ipc.protocol import (I32, AddRequest, Delta, Generate, ProtocolError, SamplingParams,
                               StepEvents, decode, encode)
from core.ipc.wire import Encoder


def frame(tag: str, **fields) -> bytes:
    return msgpack.packb({"t": tag, **fields}, use_bin_type=True)


def refused(data: bytes) -> str:
    with pytest.raises(ProtocolError) as e:
        decode(data)
    assert e.value.code == 400
    return e.value.message


def test_messages_round_trip():
    d = Delta("r", "text", [1, 2], "stop", [3], [-0.5, -1.0], [[[1, -0.5]], [[2, -1.0]]],
              {"ttft_ms": 3.0})
    assert decode(encode(d)) == d
    g = Generate("g", [1, 2, 3], max_tokens=4, stop=["a", "b"], stop_token_ids=[7])
    assert decode(encode(g)) == g


def test_packed_arrays_and_nested_parts_round_trip_and_a_kept_encoder_packs_alike():
    """encode() packs an array as its bytes and a nested dataclass as a map (msgpack's
    hook); an Encoder keeps one Packer, which a message it refused leaves clean."""
    msgs = [StepEvents(I32([1, 2]), I32([7, 8]), [[1, "stop", {"e2e_ms": 2.5}]]),
            AddRequest(3, "r", I32([5, 6, 7]), 4, 0, SamplingParams(temperature=0.5, seed=9),
                       False, "u", None, None),
            Delta("r", "t", [1], None, [2, 3], metrics={"ttft_ms": 1.0})]
    enc = Encoder()
    for m in msgs:
        assert decode(encode(m)) == m and enc(m) == encode(m)
    for bad in (Delta("r", "t", [1, {2}]), Delta("r", "t", [object()])):
        with pytest.raises(TypeError):
            enc(bad)
        with pytest.raises(TypeError):
            encode(bad)
        assert [enc(m) for m in msgs] == [encode(m) for m in msgs]
    raw = msgpack.unpackb(encode(msgs[1]))
    assert raw["prompt"] == I32([5, 6, 7]).tobytes() and raw["sampling"]["seed"] == 9


def test_a_list_of_ints_refuses_bools_floats_and_lists_naming_the_item():
    for bad, name in ((True, "bool"), (1.5, "float"), ([1], "list"), ("1", "str")):
        msg = refused(frame("generate", request_id="g", prompt=[1, 2, bad]))
        assert "wrong type" in msg or name in msg
    assert refused(frame("delta", request_id="r", text="", token_ids=[1, False])) == \
        "delta.token_ids[1]: expected int, got bool"
    assert refused(frame("delta", request_id="r", text="", token_ids=[1, 2.0])) == \
        "delta.token_ids[1]: expected int, got float"
    assert refused(frame("generate", request_id="g", prompt="p",
                         stop_token_ids=[1, False])) == "generate.stop_token_ids: wrong type list"


def test_a_list_of_numbers_takes_ints_as_floats_and_refuses_bools():
    d = decode(frame("delta", request_id="r", text="", token_ids=[1, 2], logprobs=[-1, -0.5]))
    assert d.logprobs == [-1.0, -0.5] and all(type(x) is float for x in d.logprobs)
    msg = refused(frame("delta", request_id="r", text="", token_ids=[1], logprobs=[True]))
    assert msg == "delta.logprobs: wrong type list"


def test_optional_fields_take_null_and_refuse_other_types():
    d = decode(frame("delta", request_id="r", text="", token_ids=[], finish_reason=None))
    assert d.finish_reason is None
    assert refused(frame("delta", request_id="r", text="", token_ids=[],
                         finish_reason=3)) == "delta.finish_reason: wrong type int"
    assert refused(frame("delta", request_id="r", text=None, token_ids=[])) == \
        "delta.text: expected string, got NoneType"


def test_unknown_and_missing_fields():
    assert refused(frame("delta", request_id="r", text="", token_ids=[], zz=1)) == \
        "delta: unknown field(s) zz"
    assert refused(frame("delta", request_id="r", text="")) == "delta: missing field token_ids"
