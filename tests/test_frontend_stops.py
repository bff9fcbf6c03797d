"""Stop strings: output cut before the first stop, nothing of a stop ever released."""
from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from frontend.stops import StopMatcher

alphabet = st.sampled_from("abcé€ ")
texts = st.text(alphabet, max_size=30)
stops = st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=3)


def chunks_of(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def expected(text: str, stop: list[str]) -> str:
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(hits)] if hits else text


@settings(max_examples=400, deadline=None)
@given(text=texts, stop=stops, cuts=st.lists(st.integers(0, 60), max_size=12))
def test_output_is_text_cut_at_first_stop(text, stop, cuts):
    m = StopMatcher(stop)
    released = ""
    for chunk in chunks_of(text, cuts):
        released += m.feed(chunk)
        assert not any(s in released for s in stop)
    released += m.feed("", final=True)
    assert released == expected(text, stop)
    assert m.matched == any(s in text for s in stop)


@settings(max_examples=200, deadline=None)
@given(text=texts, stop=stops)
def test_nothing_lost_and_little_held(text, stop):
    m = StopMatcher(stop)
    released = seen = ""
    for ch in text:
        seen += ch
        released += m.feed(ch)
        if m.matched:
            break
        ended = copy.copy(m)
        rest = ended.feed("", final=True)
        assert released + rest == (expected(seen, stop) if ended.matched else seen)
        assert len(seen) - len(released) < max(map(len, stop))  # held back: less than a stop


def test_held_back_until_decided():
    m = StopMatcher(["abd"])
    assert [m.feed(c) for c in "abcab"] == ["", "", "abc", "", ""]
    assert m.feed("d") == "" and m.matched


def test_held_text_released_at_the_end():
    m = StopMatcher(["world"])
    assert m.feed("hello wor") == "hello "
    assert m.feed("", final=True) == "wor" and not m.matched


def test_a_longer_stop_that_started_earlier_wins():
    m = StopMatcher(["a", " aa"])
    assert m.feed(" a") == ""
    assert m.feed("a") == "" and m.matched
    m = StopMatcher(["a", " ab"])
    assert m.feed(" a") == ""
    assert m.feed("c") == " " and m.matched
    m = StopMatcher(["a", " ab"])
    assert m.feed(" a", final=True) == " " and m.matched


def test_earliest_stop_wins_across_strings():
    m = StopMatcher(["xyz", "b"])
    assert m.feed("abxyz") == "a" and m.matched
    assert m.feed("more") == ""


def test_no_stops_passes_through():
    m = StopMatcher([])
    assert m.feed("abc") == "abc" and m.feed("", final=True) == "" and not m.matched
