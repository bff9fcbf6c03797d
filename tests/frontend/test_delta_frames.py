"""Wire 2's Deltas frames change nothing a client sees (issue 35's property test).

The frontend's step handler (CoreSide.on_core's step events, with its abort, and the
Replies sending to clients) runs a drawn scenario twice: once sending a frame per delta, as wire 1 did, and
once with its Deltas frame per client per step. A scenario interleaves core steps (tokens,
some with logprobs; "length" and EOS finishes), client aborts and stop strings (the core
finishes a stopped request one or more steps after the frontend's StopRequest). What each
client decodes must be the same deltas, request by request, in the same order: texts,
tokens, finish reasons, logprobs, and the metrics' keys (their times differ). The batched
run sends at most one frame per client per step.
"""
from __future__ import annotations

import math
from collections import defaultdict
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.ipc.protocol import (F64, I32, Delta, Deltas, ErrorReply, Pong, StepEvents, decode,
                               encode)
from core.ipc.wire import Encoder
from frontend.client.common import decode_replies
from frontend.core_side import CoreSide
from frontend.delta_frames import DeltaFrames
from frontend.replies import Replies
from frontend.request import RequestState

EOS = 256
CHARS = [ord(c) for c in "abcxy "] + [0xC3, 0xA9]   # "é" in two tokens
STOPS = [[], ["ab"], ["c", "xy"], ["é"]]


def decode_bytes(ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class PerRequest:
    """Wire 1's path: each delta encoded as a frame of its own, in the order made."""

    def __init__(self, encode_one):
        self._encode, self._out = encode_one, []

    def add(self, ident: bytes, delta: Delta) -> None:
        self._out.append((ident, self._encode(delta)))

    def take(self) -> list:
        out, self._out = self._out, []
        return out


class Router:
    def __init__(self):
        self.encode = Encoder()
        self.sent: list[tuple[int, bytes, bytes]] = []   # (step, ident, frame)
        self.step = 0

    def send(self, ident: bytes, msg) -> bool:
        self.sent.append((self.step, ident, encode(msg)))
        return True

    def send_encoded(self, frames) -> list:
        self.sent.extend((self.step, ident, data) for ident, data in frames)
        return []


class Replica:
    index, load, up = 0, 0, True

    def __init__(self):
        self.told: list = []

    def send(self, msg) -> bool:
        self.told.append(msg)
        return True

    def heard(self) -> None:
        pass


def client_gone(ident: bytes) -> None:
    raise AssertionError(f"no send fails here, yet client {ident!r} was found gone")


def core_side(requests, router: Router, replica: Replica) -> CoreSide:
    """A CoreSide over the one fake replica, with the requests in flight on it (added to
    its table directly: the replica's AddRequests would only pad what both runs compare)."""
    side = CoreSide([replica], None, None, Replies(router, client_gone),
                    on_model=lambda info: None, explain_refusals=False)
    for fid, (client, stop, include) in enumerate(requests):
        side.inflight.add(RequestState(bytes([client]), f"r{fid}", fid, [1, 2, 3],
                                       decode_bytes, list(stop), frozenset({EOS}),
                                       include, max_tokens=64))
    return side


def run(requests, script, frames_cls):
    """Play the script's steps and aborts; the frames each client got, and the messages
    for the core."""
    router, replica = Router(), Replica()
    side = core_side(requests, router, replica)
    with mock.patch("frontend.core_side.DeltaFrames", frames_cls):
        for k, (kind, what) in enumerate(script):
            router.step = k
            if kind == "abort":
                st = side.inflight.by_fid(what)
                if st is not None:
                    side.abort(st, tell_client=True)
            else:
                side.on_core(replica, what)
    return router.sent, replica.told


def per_request(sent) -> dict[str, list]:
    out = defaultdict(list)
    for _, _, frame in sent:
        msg = decode(frame)
        for d in msg.unpack() if isinstance(msg, Deltas) else [msg]:
            assert not isinstance(d, (Pong, ErrorReply))
            out[d.request_id].append(d)
    return out


def comparable(d: Delta) -> tuple:
    lps = None if d.logprobs is None else [round(x, 12) for x in d.logprobs]
    return (d.text, list(d.token_ids), d.finish_reason, d.prompt_token_ids, lps,
            d.top_logprobs, None if d.metrics is None else sorted(d.metrics))


@st.composite
def scenario(draw):
    """(requests, script): each request's (client, stops, include_stop); the script's
    items are ("abort", fid) or ("step", StepEvents). The core here stops a request some
    steps after the script's frontend would have asked (drawn, and played on both runs)."""
    n = draw(st.integers(1, 6))
    requests = [(draw(st.integers(0, 2)), draw(st.sampled_from(STOPS)), draw(st.booleans()))
                for _ in range(n)]
    with_lp = {f for f in range(n) if draw(st.booleans())}
    live, script = set(range(n)), []
    for _ in range(draw(st.integers(1, 14))):
        if live and draw(st.integers(0, 5)) == 0:
            fid = draw(st.sampled_from(sorted(live)))
            script.append(("abort", fid))
            live.discard(fid)   # the core drops it on the frontend's AbortRequest
        fids, toks, lps, finished = [], [], [], []
        for fid in sorted(live):
            for _ in range(draw(st.integers(0, 3))):
                fids.append(fid)
                toks.append(draw(st.sampled_from(CHARS)))
                lps.append(-0.5 if fid in with_lp else math.nan)
            end = draw(st.sampled_from([None] * 6 + ["length", "eos", "stop"]))
            if end == "eos":
                fids.append(fid), toks.append(EOS), lps.append(-0.1 if fid in with_lp else math.nan)
            if end is not None:
                finished.append([fid, "length" if end == "length" else "stop",
                                 {"queue_ms": 1.0}])
                live.discard(fid)
        top = [[[t, lp]] if lp == lp else None for t, lp in zip(toks, lps)]
        script.append(("step", StepEvents(I32(fids), I32(toks), finished, F64(lps), top)))
    for fid in sorted(live):   # the core ends what is left
        script.append(("step", StepEvents(I32(), I32(), [[fid, "length", None]])))
    return requests, script


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_batched_frames_give_each_client_the_same_deltas(case):
    requests, script = case
    old, old_core = run(requests, script, lambda enc: PerRequest(Encoder()))
    new, new_core = run(requests, script, DeltaFrames)
    assert [(type(m), vars(m)) for m in new_core] == [(type(m), vars(m)) for m in old_core]
    a, b = per_request(old), per_request(new)
    assert sorted(a) == sorted(b)
    for rid in a:
        assert [comparable(d) for d in b[rid]] == [comparable(d) for d in a[rid]], rid
        ends = [d for d in b[rid] if d.finish_reason is not None]
        assert len(ends) == 1 and b[rid][-1] is ends[0], rid
    per_step = defaultdict(int)
    for step, ident, _ in new:
        per_step[step, ident] += 1
    assert max(per_step.values(), default=1) == 1
    for ident in {i for _, i, _ in new}:   # the client's own decoding gives the same
        frames = [f for _, i, f in new if i == ident]
        got = [d for f in frames for d in decode_replies([f])]
        assert got == [d for f in frames for d in decode(f).unpack()]


def test_a_frame_with_inconsistent_columns_is_dropped_by_the_client():
    bad = Deltas(["a", "b"], ["x"], I32([1, 1]), I32([5, 6]))
    assert decode_replies([encode(bad)]) == []
    short = Deltas(["a"], ["x"], I32([3]), I32([5]))
    assert decode_replies([encode(short)]) == []
    negative = Deltas(["a", "b"], ["x", "y"], I32([-1, 2]), I32([5]))
    assert decode_replies([encode(negative)]) == []


def test_plain_deltas_ride_the_columns_and_the_rest_go_whole():
    plain, first = Delta("a", "x", [1, 2]), Delta("b", "", [3], None, [9, 9])
    last = Delta("c", "y", [], "stop", metrics={"e2e_ms": 1.0})
    frame = Deltas.of([plain, first, last])
    assert frame.request_ids == ["a"] and frame.full == [first, last] and len(frame) == 3
    assert decode(encode(frame)).unpack() == [plain, first, last]
    assert isinstance(decode(encode(frame)), Deltas)
