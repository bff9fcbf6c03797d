"""A long step is not a hung one (worker/step_pulse.py, core/worker_link.py): while a step
computes, the worker pulses StepAlive and the core's step timeout counts from the last
pulse; a step that only waits (a stopped or deadlocked worker) sends none and is still
replaced after the timeout."""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from core.ipc.protocol import (F64, I32, I64, ForwardBatch, ModelInfo, Shutdown, StepAlive,
                               StepResult)
from core.worker_link import WorkerDied, WorkerLink
from tests.fake_channel import Sent
from worker import step_pulse
from worker.process import serve
from worker.step_pulse import StepPulse

PERIOD = 0.05


def compute(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def test_a_computing_step_pulses_and_a_waiting_one_does_not():
    sent = Sent()
    pulse = StepPulse(lambda: sent, pid=7, period=PERIOD)
    try:
        pulse.begin(3)
        compute(0.5)
        computing = len(sent.msgs)
        time.sleep(0.5)            # in the step, but no CPU: a stopped or deadlocked worker
        waiting = len(sent.msgs) - computing
        pulse.end()
        compute(0.3)               # between steps: nothing to say
        after = len(sent.msgs) - computing - waiting
    finally:
        pulse.close()
    assert computing >= 3 and all(m == StepAlive(step=3, pid=7) for m in sent.msgs)
    assert waiting <= 1 and after <= 1   # one pulse may straddle the change


class Runner:
    """A worker's runner whose steps take `seconds`, computing or sleeping."""
    info = ModelInfo(model="pulse-test", num_blocks=1, block_size=16, max_model_len=16,
                     vocab_size=8, eos_ids=[])

    def __init__(self, seconds: float, computes: bool):
        self.seconds, self.computes = seconds, computes
        self.released = threading.Event()   # a waiting step ends early once the test is done

    def run(self, batch: ForwardBatch) -> StepResult:
        if self.computes:
            compute(self.seconds)
        else:
            self.released.wait(self.seconds)
        return StepResult(step=batch.step, tokens=I32([5]))


def one_row(step: int) -> ForwardBatch:
    """A one-token batch (the runner above reads only its step)."""
    one = I32([0])
    return ForwardBatch(step, one, one, one, one, I32([0, 1]), I32([1]), one, 1, one,
                        F64([0.0]), F64([1.0]), one, I64([0]), one)


@pytest.mark.parametrize("computes", [True, False])
def test_the_core_waits_out_a_long_step_only_while_it_computes(monkeypatch, computes):
    """The real worker loop and the core's link, a 1.5 s step against a 0.5 s timeout."""
    monkeypatch.setattr(step_pulse, "PULSE_S", PERIOD)
    ctx = zmq.Context()
    front = ctx.socket(zmq.PULL)
    front.bind("inproc://front")
    link = WorkerLink(ctx, "inproc://to-core", "inproc://from-core", front, step_timeout=0.5)
    killed = []
    link._kill = lambda: killed.append(link.pid)   # the "worker" is this process
    runner = Runner(1.5, computes)
    worker = threading.Thread(target=serve, args=(runner, ctx, "inproc://to-core",
                                                  "inproc://from-core"))
    worker.start()
    try:
        link.pid = link.wait_ready(30, lambda: None).pid
        link.send(one_row(step=1))
        if computes:
            assert list(link.result(1, 1, lambda readable: None).tokens) == [5] and not killed
        else:
            with pytest.raises(WorkerDied, match="silent for 0.5s"):
                link.result(1, 1, lambda readable: None)
            assert killed == [link.pid]
    finally:
        runner.released.set()
        link.send(Shutdown())
        worker.join(10)
        link.close()
        front.close()
        ctx.term()
    assert not worker.is_alive()
