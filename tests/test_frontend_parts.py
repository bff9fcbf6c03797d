"""The frontend's small parts alone: validation, request-id salvage, event grouping, and a
request's deltas (EOS, stop strings, first-delta prompt)."""
from __future__ import annotations

import msgpack
import pytest

from core.ipc.protocol import I32, Generate, ModelInfo, ProtocolError, StepEvents
from frontend.events import group_events
from frontend.request import RequestState
from frontend.salvage import peek_request_id
from frontend.validate import InvalidRequest, check_params, check_prompt_ids

INFO = ModelInfo("m", 8, 16, max_model_len=10, vocab_size=300, eos_ids=[256])


def gen(**kw) -> Generate:
    return Generate(**{"request_id": "r", "prompt": "hi", **kw})


@pytest.mark.parametrize("kw", [
    dict(request_id=""), dict(prompt=""), dict(prompt=[]), dict(max_tokens=0),
    dict(temperature=-1.0), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=1.01), dict(top_k=-1), dict(priority=1001),
    dict(priority=-1001), dict(seed=-1), dict(seed=2 ** 63), dict(stop=["a", ""]),
    dict(top_k=2 ** 31), dict(top_k=2 ** 64 - 1), dict(max_tokens=2 ** 31),
    dict(max_tokens=2 ** 63), dict(max_tokens=-2 ** 63), dict(temperature=1e-7),
    dict(temperature=1e4 + 1), dict(temperature=float("-inf")), dict(top_p=float("nan")),
    dict(priority=2 ** 63), dict(request_id="r" * 257), dict(stop=["s"] * 17),
    dict(stop=["s" * 257]),
])
def test_check_params_refuses(kw):
    with pytest.raises(InvalidRequest) as e:
        check_params(gen(**kw))
    field = next(iter(kw))
    assert e.value.field == field and field in str(e.value)


@pytest.mark.parametrize("kw", [dict(max_tokens=11), dict(top_k=301, max_tokens=5)])
def test_check_params_with_the_model_refuses(kw):
    check_params(gen(**kw))  # in the wire types' range: only the model knows better
    with pytest.raises(InvalidRequest) as e:
        check_params(gen(**kw), INFO)
    assert e.value.field == next(iter(kw))


def test_check_params_accepts_edges():
    check_params(gen(temperature=0.0, top_p=1.0, top_k=0, priority=-1000, seed=2 ** 63 - 1,
                     stop=["x"]))
    check_params(gen(priority=1000, seed=0, stop=None))
    check_params(gen(max_tokens=10, top_k=300, temperature=1e-6, stop=["s" * 256] * 16,
                     request_id="r" * 256), INFO)
    check_params(gen(max_tokens=2 ** 31 - 1, top_k=2 ** 31 - 1, temperature=1e4))


@pytest.mark.parametrize("ids", [[], [-1], [300], [1] * 10])
def test_check_prompt_ids_refuses(ids):
    with pytest.raises(InvalidRequest):
        check_prompt_ids(ids, INFO)


def test_check_prompt_ids_accepts_up_to_limit():
    check_prompt_ids([0, 299] + [1] * 7, INFO)


def test_peek_request_id():
    big = msgpack.packb({"t": "generate", "prompt": [256] * 1000, "request_id": "abc"})
    assert peek_request_id(big) == "abc"
    assert peek_request_id(msgpack.packb({"request_id": 5})) is None
    for junk in (b"", b"\xc1", msgpack.packb([1, 2]), big[:100]):
        assert peek_request_id(junk) is None


def test_group_events_orders_and_validates():
    ev = StepEvents(I32([3, 1, 3]), I32([7, 8, 9]), [[1, "stop"], [5, "abort"]])
    assert group_events(ev) == [(3, [7, 9], None), (1, [8], "stop"), (5, [], "abort")]
    with pytest.raises(ProtocolError):
        group_events(StepEvents(I32([1]), I32([]), []))
    with pytest.raises(ProtocolError):
        group_events(StepEvents(I32([]), I32([]), [[1, "done"]]))


def state(**kw) -> RequestState:
    args = dict(ident=b"c", request_id="r", fid=0, prompt_ids=[104, 105],
                decode=lambda ids: bytes(ids).decode("utf-8", "replace"),
                eos_ids=frozenset({256}))
    return RequestState(**{**args, **kw})


def test_first_delta_carries_the_prompt_and_eos_is_not_text():
    st = state()
    a = st.step([104], None)
    assert a.delta.prompt_token_ids == [104, 105] and a.delta.text == "h" and not a.done
    b = st.step([256], "stop")
    assert b.delta.prompt_token_ids is None and b.delta.text == ""
    assert b.delta.token_ids == [256] and b.delta.finish_reason == "stop" and b.done


def test_stop_string_cuts_and_asks_the_core_to_abort():
    st = state(stop=["lo"])
    texts = [st.step([b], None) for b in b"hel"]
    assert [t.delta.text for t in texts] == ["h", "e", ""]
    hit = st.step([ord("o")], None)
    assert hit.delta.text == "" and hit.delta.finish_reason == "stop"
    assert hit.done and hit.abort_core


def test_held_text_released_when_the_core_finishes():
    st = state(stop=["lo"])
    st.step(list(b"hel"), None)
    end = st.step([], "length")
    assert end.delta.text == "l" and end.delta.finish_reason == "length" and not end.abort_core
