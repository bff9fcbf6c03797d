"""The frontend's side of prompt logprobs without processes: StepEvents' prompt entries
regrouped per request and checked, kept by position until the first delta, which alone
carries them; the client's Result in vLLM's shape."""
from __future__ import annotations

import pytest

from core.ipc.protocol import DEFAULT_MAX_FRAME_BYTES, I32, Delta, ProtocolError, StepEvents, encode
from core.prompt_logprobs import parts
from frontend.client.common import Result
from frontend.events import group_events
from tests.frontend.test_frontend_parts import ev, state

A = [-1.0, 2, [[7, -0.5]]]
B = [-0.25, 1, [[9, -0.25]]]
C = [-3.0, 5, [[7, -0.1]]]


def test_group_events_carries_prompt_entries_alone_or_with_tokens():
    e = StepEvents(I32([1]), I32([5]), [], prompt_logprobs=[[2, 1, [A]], [1, 3, [B, C]]])
    got = {r.fid: (r.tokens, r.prompt) for r in group_events(e)}
    assert got == {1: ([5], [[3, [B, C]]]), 2: ([], [[1, [A]]])}
    for bad in ([2, 0, [A]], [2, 1], ["2", 1, [A]], [2, 1, "x"], 5):
        with pytest.raises(ProtocolError):
            group_events(StepEvents(I32(), I32(), [], prompt_logprobs=[bad]))


def test_the_first_delta_takes_them_by_position_and_later_ones_none():
    st = state(prompt_ids=[104, 105, 106, 107], prompt_logprobs=True)
    st.prompt_scores([[2, [B, C]]])
    st.prompt_scores([[1, [A, B]], [9, [A]]])   # a re-run's repeat overwrites; past the end: dropped
    first = st.step(ev([104])).delta
    assert first.prompt_logprobs == [None, A, B, C]
    st.prompt_scores([[1, [C]]])                 # after the first delta: ignored
    assert st.step(ev([105])).delta.prompt_logprobs is None
    assert state().step(ev([104])).delta.prompt_logprobs is None   # not asked


def test_result_turns_them_into_vllms_dicts():
    r = Result("r")
    r.add(Delta("r", "h", [104], None, [3, 6, 8], prompt_logprobs=[None, A, [-2.0, 3, [[1, -0.1]]]]))
    want = [None, {6: -1.0, 7: -0.5}, {8: -2.0, 1: -0.1}]
    assert r.prompt_logprobs == want
    r.add(Delta("r", "i", [105], "length"))
    assert r.prompt_logprobs == want


def test_core_cuts_big_prompt_logprobs_into_frames_the_frontend_reads():
    """8,192 positions with 20 alternatives (~2.2 MB as one frame) go as several StepEvents
    under the 1 MiB frame limit, every position once and in order."""
    entry = [-1.2345678901234567, 12345, [[40000 + k, -3.3333333333333335] for k in range(20)]]
    deliveries = [[0, 1, [entry] * 8192], [1, 5, [[-0.5, 1, []]] * 3]]
    cut = parts(deliveries)
    assert len(cut) > 1
    seen: dict[int, list] = {0: [], 1: []}
    for part in cut:
        frame = encode(StepEvents(I32(), I32(), [], prompt_logprobs=part))
        assert len(frame) < DEFAULT_MAX_FRAME_BYTES / 2
        for fid, first, entries in part:
            seen[fid].extend(range(first, first + len(entries)))
    assert seen == {0: list(range(1, 8193)), 1: [5, 6, 7]}
