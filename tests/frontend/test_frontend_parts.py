"""The frontend's small parts alone: validation, request-id salvage, event grouping, and a
request's deltas (EOS, stop strings, first-delta prompt)."""
from __future__ import annotations

import msgpack
import pytest

from core.ipc.protocol import F64, I32, WIRE, Generate, ModelInfo, ProtocolError, StepEvents
from frontend.events import RequestEvents, group_events
from frontend.request import METRIC_KEYS, RequestState
from core.ipc.wire import peek_request_id
from frontend.validate import InvalidField, check_params, check_prompt_ids

INFO = ModelInfo("m", 8, 16, max_model_len=10, vocab_size=300, eos_ids=[256])


def gen(**kw) -> Generate:
    return Generate(**{"request_id": "r", "prompt": "hi", "wire": WIRE, **kw})


@pytest.mark.parametrize("kw", [
    dict(request_id=""), dict(prompt=""), dict(prompt=[]), dict(max_tokens=0),
    dict(temperature=-1.0), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=1.01), dict(top_k=-1), dict(priority=1001),
    dict(priority=-1001), dict(seed=-1), dict(seed=2 ** 63), dict(stop=["a", ""]),
    dict(top_k=2 ** 31), dict(top_k=2 ** 64 - 1), dict(max_tokens=2 ** 31),
    dict(max_tokens=2 ** 63), dict(max_tokens=-2 ** 63), dict(temperature=1e-7),
    dict(temperature=1e4 + 1), dict(temperature=float("-inf")), dict(top_p=float("nan")),
    dict(priority=2 ** 63), dict(request_id="r" * 257), dict(stop=["s"] * 17),
    dict(stop=["s" * 257]), dict(wire=1), dict(wire=3),
])
def test_check_params_refuses(kw):
    with pytest.raises(InvalidField) as e:
        check_params(gen(**kw))
    field = next(iter(kw))
    assert e.value.field == field and field in str(e.value)


@pytest.mark.parametrize("kw", [dict(max_tokens=11), dict(top_k=301, max_tokens=5)])
def test_check_params_with_the_model_refuses(kw):
    check_params(gen(**kw))  # in the wire types' range: only the model knows better
    with pytest.raises(InvalidField) as e:
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
    with pytest.raises(InvalidField):
        check_prompt_ids(ids, INFO)


def test_check_prompt_ids_accepts_up_to_limit():
    check_prompt_ids([0, 299] + [1] * 7, INFO)


def test_check_prompt_ids_names_the_field_and_fits_max_tokens_when_asked():
    for ids, field in (([], "prompt"), ([300], "prompt"), ([1] * 10, "prompt")):
        with pytest.raises(InvalidField) as e:
            check_prompt_ids(ids, INFO)
        assert e.value.field == field
    check_prompt_ids([1] * 7, INFO)                 # no max_tokens given: cut at the context
    check_prompt_ids([1] * 7, INFO, max_tokens=3)   # 7 + 3 = max_model_len: fits
    with pytest.raises(InvalidField) as e:
        check_prompt_ids([1] * 7, INFO, max_tokens=4)
    assert e.value.field == "max_tokens" and "11" in str(e.value)


def test_peek_request_id():
    big = msgpack.packb({"t": "generate", "prompt": [256] * 1000, "request_id": "abc"})
    assert peek_request_id(big) == "abc"
    assert peek_request_id(msgpack.packb({"request_id": 5})) is None
    for junk in (b"", b"\xc1", msgpack.packb([1, 2]), big[:100]):
        assert peek_request_id(junk) is None


def test_group_events_orders_and_validates():
    ev = StepEvents(I32([3, 1, 3]), I32([7, 8, 9]), [[1, "stop", {"queue_ms": 1.0}], [5, "abort"]])
    got = [(r.fid, r.tokens, r.reason, r.figures) for r in group_events(ev)]
    assert got == [(3, [7, 9], None, None), (1, [8], "stop", {"queue_ms": 1.0}),
                   (5, [], "abort", None)]
    with pytest.raises(ProtocolError):
        group_events(StepEvents(I32([1]), I32([]), []))
    with pytest.raises(ProtocolError):
        group_events(StepEvents(I32([]), I32([]), [[1, "done"]]))
    with pytest.raises(ProtocolError):
        group_events(StepEvents(I32([1]), I32([2]), [], F64([0.0, 1.0]), [None, None]))


def test_group_events_keeps_logprobs_of_the_rows_that_asked():
    ev = StepEvents(I32([3, 1]), I32([7, 8]), [], F64([-0.5, float("nan")]),
                    [[[7, -0.5], [2, -1.5]], None])
    a, b = group_events(ev)
    assert (a.logprobs, a.top) == ([-0.5], [[[7, -0.5], [2, -1.5]]])
    assert (list(b.logprobs), list(b.top)) == ([], [])


def state(**kw) -> RequestState:
    args = dict(ident=b"c", request_id="r", fid=0, prompt_ids=[104, 105],
                decode=lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", "replace"),
                stop_ids=frozenset({256}))
    return RequestState(**{**args, **kw})


def ev(tokens, reason=None, figures=None) -> RequestEvents:
    return RequestEvents(0, list(tokens), reason=reason, figures=figures)


def test_first_delta_carries_the_prompt_and_eos_is_not_text():
    st = state()
    a = st.step(ev([104]))
    assert a.delta.prompt_token_ids == [104, 105] and a.delta.text == "h" and not a.done
    b = st.step(ev([256], "stop", {"queue_ms": 2.0, "log_id": 4}))
    assert b.delta.prompt_token_ids is None and b.delta.text == ""
    assert b.delta.token_ids == [256] and b.delta.finish_reason == "stop" and b.done
    m = b.delta.metrics
    assert list(m) == list(METRIC_KEYS) and m["queue_ms"] == 2.0 and m["log_id"] == 4
    assert m["ttft_ms"] <= m["e2e_ms"]


def test_a_stop_token_is_text_with_include_stop_str_in_output():
    st = state(stop_ids=frozenset({65}), include_stop=True)
    assert st.step(ev([104, 65], "stop")).delta.text == "hA"
    assert state(stop_ids=frozenset({65})).step(ev([104, 65], "stop")).delta.text == "h"


def test_stop_string_cuts_then_waits_for_the_core():
    st = state(stop=["lo"])
    texts = [st.step(ev([b])) for b in b"hel"]
    assert [t.delta.text for t in texts] == ["h", "e", ""]
    hit = st.step(ev([ord("o")]))
    assert hit.delta.text == "" and hit.delta.finish_reason is None and not hit.done
    assert hit.stop_core == 4 and st.stopping
    end = st.step(ev([], "stop", {"queue_ms": 1.0}))
    assert end.done and end.delta.finish_reason == "stop" and end.delta.token_ids == []
    assert end.delta.metrics["queue_ms"] == 1.0


def test_include_stop_str_in_output_keeps_the_stop_string():
    st = state(stop=["lo"], include_stop=True)
    texts = [st.step(ev([b])).delta.text for b in b"hello"]
    assert "".join(texts) == "hello"[:5] and st.stopping


def test_no_stop_string_before_min_tokens():
    st = state(stop=["h"], min_tokens=2)
    assert st.step(ev([ord("h")])).delta.text == "h" and not st.stopping
    out = st.step(ev([ord("h")]))
    assert out.stop_core == 2 and out.delta.text == ""


def test_held_text_released_when_the_core_finishes():
    st = state(stop=["lo"])
    st.step(ev(b"hel"))
    end = st.step(ev([], "length"))
    assert end.delta.text == "l" and end.delta.finish_reason == "length" and end.stop_core is None


def test_a_failover_seed_only_for_unseeded_sampling_and_stable():
    from frontend.sampling import failover_seed, sampling_of
    sampled = Generate("r1", "hi", temperature=0.7)
    s = failover_seed(sampled, b"client")
    assert s == failover_seed(sampled, b"client") and 0 <= s < 2 ** 63
    assert s != failover_seed(sampled, b"other") != failover_seed(Generate("r2", "hi", temperature=0.7), b"client")
    assert failover_seed(Generate("r", "hi"), b"c") is None                      # greedy
    assert failover_seed(Generate("r", "hi", temperature=0.7, seed=3), b"c") is None
    assert sampling_of(sampled, s).seed == s
    assert sampling_of(Generate("r", "hi", temperature=0.7, seed=3), s).seed == 3


class _Replica:
    """What StatsQueries reads of a replica, and the queries it was sent."""

    def __init__(self, index: int, up: bool = True):
        from types import SimpleNamespace
        self.index, self.up, self.joined = index, up, False
        self.pids = {"core": 100 + index, "worker": 200 + index}
        self.info = SimpleNamespace(max_model_len=64 + index)
        self.sent = []

    def send(self, msg) -> bool:
        self.sent.append(msg)
        return True


def test_stats_queries_wait_for_every_live_replica_and_a_dead_one_counts_as_answered():
    from core.ipc.protocol import CoreStats, ErrorReply, StatsReply
    from frontend.replica_stats import StatsQueries

    def stats(n):
        return {"running": n, "waiting": 0, "max_model_len": 64}

    q = StatsQueries("gone")
    reps = [_Replica(0), _Replica(1), _Replica(2, up=False)]
    assert q.ask(b"a", reps) and q.ask(b"b", reps)
    assert [len(r.sent) for r in reps] == [2, 2, 0]          # a down replica is not asked
    qa, qb = (m.qid for m in reps[0].sent)
    assert q.answer(reps[0], CoreStats(qid=qa, stats=stats(3))) is None
    assert q.answer(reps[0], CoreStats(qid=qa, stats=stats(3))) is None  # twice: ignored
    ident, reply = q.answer(reps[1], CoreStats(qid=qa, stats=stats(4)))
    assert ident == b"a" and isinstance(reply, StatsReply) and reply.stats["running"] == 7
    assert [s["replica"] for s in reply.stats["replicas"]] == [0, 1]
    assert q.answer(reps[1], CoreStats(qid=qa, stats=stats(4))) is None  # answered already
    assert q.answer(reps[1], CoreStats(qid=qb, stats=stats(5))) is None
    (ident, reply), = q.replica_gone(0)                      # b waited only on replica 0
    assert ident == b"b" and reply.stats["running"] == 5
    assert q.ask(b"c", reps[:1])
    assert q.replica_gone(0) == [(b"c", ErrorReply(None, 503, "gone"))]
    assert not q.ask(b"d", [reps[2]])
