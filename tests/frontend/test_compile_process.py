"""The frontend's compile process (frontend/compile_process.py): the same verdicts as a
compile on the calling thread, the CPU time charged to the calling thread, a compile past the
bound stopped there, a child that dies replaced, and no process left after close."""
from __future__ import annotations

import json
import threading
import time

import pytest

from core.ipc.lifeline import cpu_seconds, pid_alive
from core.ipc.protocol import Constraint
from frontend.compile_check import CompileCheck
from frontend.compile_process import CompileChild, CompileChildren
from tests.frontend.test_compile_check import BAD, OK, new_slow_schema
from tests.waiting import wait_until


def slow(title: str) -> Constraint:
    return Constraint("json", json.dumps(new_slow_schema(title)))


@pytest.fixture
def children():
    kids = CompileChildren(bound_ms=60_000)
    yield kids
    pids = [c._proc.pid for c in kids._all if c._proc is not None]
    kids.close()
    assert not any(pid_alive(pid) for pid in pids)


def test_the_verdicts_are_the_calling_threads_and_the_cpu_time_is_charged_to_it(children):
    here = CompileCheck(bound_ms=60_000)
    there = CompileCheck(bound_ms=60_000, run=children.compile)
    for c in (OK, BAD, Constraint("regex", "[ab]{3}"), Constraint("grammar", "start: x\nx:")):
        assert there.error(c) == here.error(c), c
    before = children.cpu_s()
    outcome = children.compile(slow("charged"))
    assert outcome.error is None and not outcome.stopped and outcome.ms > 5
    assert children.cpu_s() == pytest.approx(before + outcome.ms / 1000)
    other = []
    t = threading.Thread(target=lambda: other.append(children.cpu_s()))
    t.start()
    t.join()
    assert other == [0.0]   # another thread's compiles are not this one's


def test_a_compile_past_the_bound_is_stopped_there_and_the_next_gets_a_new_child():
    kids = CompileChildren(bound_ms=30)
    try:
        check = CompileCheck(bound_ms=30, run=kids.compile)
        assert check.error(Constraint("regex", "[ab]")) is None
        [child] = kids._all
        first = child._proc.pid
        began = time.monotonic()
        error = check.error(Constraint("json", json.dumps(new_slow_schema("past"))))
        assert "took over 30 ms (stopped at" in error and "--max-compile-ms" in error
        assert time.monotonic() - began < 5
        assert not pid_alive(first)
        assert check.error(OK) is None and child._proc.pid != first
    finally:
        kids.close()


def test_a_child_gone_between_compiles_is_replaced_without_a_refusal(children):
    assert children.compile(OK).error is None
    [child] = children._all
    child._started().kill()
    child._proc.wait()
    assert children.compile(OK).error is None


def test_a_child_that_dies_in_a_compile_fails_that_constraint_only():
    child = CompileChild(bound_ms=60_000)
    try:
        pid = child._started().pid
        start = cpu_seconds(pid)
        out = []
        t = threading.Thread(target=lambda: out.append(child.compile(slow("killed"))))
        t.start()
        wait_until(lambda: cpu_seconds(pid) > start, 10, what="the compile under way")
        child._proc.kill()
        t.join(10)
        assert "the compile check ended on it" in out[0].error
        assert child.compile(OK).error is None
    finally:
        child.close()


def test_compiles_in_flight_at_once_each_get_a_child(children):
    outs = []
    threads = [threading.Thread(target=lambda i=i: outs.append(children.compile(slow(f"t{i}"))))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [o.error for o in outs] == [None, None]
    assert 1 <= len(children._all) <= 2
