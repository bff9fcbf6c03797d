"""A core that stops (SIGSTOP, a stuck machine) says nothing: the frontend's silence rule,
counted in the frontend's own waking time, and the core's side of a new epoch (it forgets
what it held before it is routed to again). The end-to-end faults are in
tests/group/test_replica_faults.py."""
from __future__ import annotations

import pytest

from core.frontend_watch import FrontendWatch
from core.ipc.protocol import Hello
from core.process import CoreLoop
from core.sched import Finished, FinishReason, TokenEvent
from core.step_commit import StepCommit
from frontend import silence
from frontend.silence import AwakeClock, Silence
from tests.core.test_core_guards import add, loop  # noqa: F401  (loop: a CoreLoop, no worker)

class FakeTime:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    t = FakeTime()
    monkeypatch.setattr(silence.time, "monotonic", t)
    return t


def test_silence_past_the_deadline_while_the_frontend_runs(clock):
    awake = AwakeClock()
    s = Silence(awake)
    for _ in range(8):          # 2 s of turns 0.25 s apart, nothing heard
        clock.t += 0.25
        awake.tick()
    assert not s.silent()
    clock.t += 0.25
    awake.tick()
    assert s.silent()
    s.heard()
    assert not s.silent()


def test_time_the_frontend_was_stopped_is_not_the_cores_silence(clock):
    """Stopped 5 s itself, the frontend wakes to beats still queued, unread: that is no
    core's silence."""
    awake = AwakeClock()
    s = Silence(awake)
    clock.t += 5.0
    awake.tick()
    assert not s.silent()
    s.gone_now()                # a Leave
    assert s.silent()


def test_a_greeting_in_a_new_epoch_is_new():
    w = FrontendWatch(local=False)
    assert w.greet(7, 0) and not w.greet(7, 0)
    assert w.greet(7, 3) and w.epoch == 3 and not w.greet(7, 3)
    assert w.greet(8, 3)        # another frontend


def test_a_new_epoch_aborts_what_the_core_held(loop):
    """The frontend dropped this core (silent) and re-ran its requests elsewhere: greeted
    again, in a new epoch, it holds nothing before it is routed to."""
    loop.hello(Hello(pid=1, epoch=0))
    add(loop, 5, [1, 2, 3])
    add(loop, 6, [4, 5])
    loop.hello(Hello(pid=1, epoch=0))          # a repeated greeting keeps them
    assert set(loop.seq_of) == {5, 6}
    loop.hello(Hello(pid=1, epoch=2))
    assert loop.seq_of == {} and loop.fid_of == {}
    assert not loop.engine.sched.has_unfinished()


def test_a_fid_sent_again_has_one_sequence(loop):
    """Two sequences under one fid published into one stream and then died on a KeyError:
    the newest AddRequest is the live one."""
    add(loop, 5, [1, 2, 3])
    first = loop.seq_of[5]
    add(loop, 5, [1, 2, 3])
    assert loop.seq_of[5] != first and list(loop.fid_of) == [loop.seq_of[5]]
    assert loop.engine.sched.unfinished() == [loop.seq_of[5]]
    sent = []
    loop.send = sent.append
    new = loop.seq_of[5]
    loop.publish(StepCommit([TokenEvent(first, 9), TokenEvent(new, 7),
                             Finished(new, FinishReason.LENGTH),
                             Finished(first, FinishReason.LENGTH)]))
    assert list(sent[0].fids) == [5] and list(sent[0].tokens) == [7]
    assert [f[0] for f in sent[0].finished] == [5]
    assert loop.seq_of == {} and loop.fid_of == {}
