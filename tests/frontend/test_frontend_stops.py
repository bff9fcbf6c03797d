"""Stop strings: output cut before the first stop, nothing of a stop ever released."""
from __future__ import annotations

import copy
import sys

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


# ------------------------------------------------------------------ against a naive reference


class NaiveStopMatcher:
    """The obvious matcher: search held + new for every stop, try every suffix length."""

    def __init__(self, stops):
        self.stops, self.held, self.matched = list(stops), "", False

    def feed(self, text: str, final: bool = False) -> str:
        if self.matched:
            return ""
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        cut = min(hits, default=None)
        longest = max(map(len, self.stops), default=0)
        partial = next((k for k in range(min(len(buf), longest - 1), 0, -1)
                        if any(s.startswith(buf[len(buf) - k:]) for s in self.stops)), 0)
        pending = len(buf) if final else len(buf) - partial
        if cut is not None and cut <= pending:
            self.matched, self.held = True, ""
            return buf[:cut]
        self.held = buf[pending:]
        return buf[:pending]


small = st.sampled_from(["ab", "abc", "aab"]).flatmap(
    lambda a: st.tuples(st.text(a, max_size=40),
                        st.lists(st.text(a, min_size=1, max_size=6), min_size=1, max_size=5)))


@settings(max_examples=500, deadline=None)
@given(case=small, cuts=st.lists(st.integers(0, 60), max_size=15), final_early=st.booleans())
def test_same_as_the_naive_reference(case, cuts, final_early):
    text, stop = case
    fast, slow = StopMatcher(stop), NaiveStopMatcher(stop)
    pieces = chunks_of(text, cuts)
    for i, piece in enumerate(pieces):
        final = final_early and i == len(pieces) - 1
        assert fast.feed(piece, final) == slow.feed(piece, final)
        assert fast.matched == slow.matched
    assert fast.feed("", final=True) == slow.feed("", final=True)
    assert fast.matched == slow.matched


# ------------------------------------------------------------------ cost


def python_lines(fn) -> int:
    """Line events executed in frontend/ while fn() runs: work, counted without a clock.
    The matcher's per-character work is all Python (one automaton step per stop); its only
    C-level work per feed is copying the held text, shorter than the longest stop."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def scope(frame, event, arg):
        return local if "/frontend/" in frame.f_code.co_filename else None

    old = sys.gettrace()
    sys.settrace(scope)
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def feed_cost(stop_len: int, n_stops: int = 16) -> float:
    """Line events per output character, fed one character at a time, for n_stops stops of
    stop_len characters that share long prefixes with an output that never completes one:
    the worst case for holding back and for trying suffixes."""
    stops = ["ab" * (stop_len // 2 - 1) + chr(0x41 + i) * 2 for i in range(n_stops)]
    output = ("ab" * stop_len + "c") * 8
    m = StopMatcher(stops)
    work = python_lines(lambda: [m.feed(ch) for ch in output])
    assert not m.matched
    return work / len(output)


def test_many_long_stops_cost_per_character_not_per_stop_length():
    stops = [chr(0x41 + i) * 256 for i in range(16)]
    assert python_lines(lambda: StopMatcher(stops)) < 20 * 16 * 256
    long, short = feed_cost(256), feed_cost(16)
    # cost proportional to stops x their length would be ~16 x 256 = 4096 lines a character
    assert long < 32 * 16, long
    assert long < 1.5 * short, (long, short)


@settings(max_examples=100, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 60), max_size=12))
def test_without_stops_every_piece_is_released_as_it_comes(text, cuts):
    m = StopMatcher([])
    assert [m.feed(c) for c in chunks_of(text, cuts)] == chunks_of(text, cuts)
    assert m.feed("", final=True) == "" and not m.matched


def test_an_empty_stop_matches_before_any_text():
    m = StopMatcher(["", "x"])
    assert m.feed("abc") == "" and m.matched
