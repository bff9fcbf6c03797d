"""The worker's grammar builds off the step path (worker/grammar_builds.py; docs/structured.md,
"Built before the step"), on the tiny model: a key asked for is built on the build thread and
answered once, and a step that then needs it builds nothing."""
from __future__ import annotations

import json

import pytest

from core.ipc.protocol import Constraint, GrammarReady, PrepareGrammar, SamplingParams
from tests.fake_channel import Sent
from tests.waiting import wait_until
from tests.worker.test_structured_worker import SCHEMAS, prompt, run
from worker.grammar_builds import GrammarBuilds
from worker.load import make_runner

C = Constraint("json", json.dumps(SCHEMAS[1]))
PID = 77


def build_off_the_step(g, sent: Sent, c: Constraint) -> None:
    """Ask a build thread over `g` for `c` and wait for its answer."""
    builds = GrammarBuilds(g, lambda: sent, PID)
    try:
        assert builds.prepare(PrepareGrammar(c.key, c.kind, c.text))
        wait_until(lambda: sent.msgs, 30, what="GrammarReady")
    finally:
        builds.close()


@pytest.fixture(scope="module")
def runner():
    return make_runner("tiny", num_blocks=128)


def test_a_key_is_built_off_the_step_and_the_step_builds_nothing(runner, monkeypatch):
    g, sent = runner.grammars, Sent()
    builds = GrammarBuilds(g, lambda: sent, PID)
    try:
        ask = PrepareGrammar(C.key, C.kind, C.text)
        assert builds.prepare(ask)
        assert not builds.prepare(ask)   # being built, or built: never twice
        wait_until(lambda: sent.msgs, 30, what="GrammarReady")
        assert sent.msgs == [GrammarReady(key=C.key, pid=PID)]
        assert g.holds(C.key) and not builds.prepare(ask)
    finally:
        builds.close()

    def no_build(c):
        raise AssertionError(f"a step built {c.kind}")

    monkeypatch.setattr(g, "build", no_build)
    [(out, reason)], _ = run(runner, [(prompt(1), 40, SamplingParams(constraint=C))])
    assert reason == "stop" and out


def test_the_build_thread_runs_as_background(runner, monkeypatch):
    """SCHED_IDLE and niced (core/thread_nice.py): a build gives a step's threads the core at
    once."""
    from core.thread_nice import BACKGROUND_NICE, is_background, niceness_of_this_thread
    seen = {}
    real = runner.grammars.build

    def spy(c):
        seen["background"], seen["nice"] = is_background(), niceness_of_this_thread()
        return real(c)

    monkeypatch.setattr(runner.grammars, "build", spy)
    build_off_the_step(runner.grammars, Sent(), Constraint("regex", "q[0-9]{3}"))
    assert seen == {"background": True, "nice": min(19, niceness_of_this_thread() + BACKGROUND_NICE)}


def test_a_failed_build_still_answers_and_leaves_the_key_to_the_step(runner, monkeypatch):
    g, sent = runner.grammars, Sent()
    c = Constraint("regex", "z[0-9]{2}")

    def broken(c):
        raise RuntimeError("a bug in a build")

    monkeypatch.setattr(g, "build", broken)
    build_off_the_step(g, sent, c)
    assert sent.msgs == [GrammarReady(key=c.key, pid=PID)] and not g.holds(c.key)
    monkeypatch.undo()   # the step builds it itself
    [(out, reason)], _ = run(runner, [(prompt(2), 8, SamplingParams(constraint=c))])
    assert reason == "stop" and len(out) >= 3


def test_the_first_sequence_takes_the_warmed_copy_and_samples_the_same(runner):
    """The build thread also computes a copy's first mask (Grammars.warmed); the key's first
    sequence takes that copy, and its greedy tokens equal those of a sequence whose matcher
    the step copied and masked itself."""
    g, sent = runner.grammars, Sent()
    c = Constraint("json", json.dumps({"type": "object", "properties": {
        "warm": {"type": "integer"}}, "required": ["warm"]}))
    build_off_the_step(g, sent, c)
    assert g.has_spare(c.key)
    [(warm, reason)], _ = run(runner, [(prompt(3), 24, SamplingParams(constraint=c))])
    assert not g.has_spare(c.key) and reason in ("stop", "length")
    [(copied, _)], _ = run(runner, [(prompt(3), 24, SamplingParams(constraint=c))])
    assert warm == copied and warm
