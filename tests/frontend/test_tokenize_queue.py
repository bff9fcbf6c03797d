"""The tokenizing thread's fair queue alone (frontend/tokenizing.py): a job's time past its
guess (a slow compile) is charged to its client, whose queued jobs then go after those of a
client that used little (docs/structured.md, "The compile budget")."""
from __future__ import annotations

import threading

from core.ipc.protocol import Generate
from frontend.tokenizing import TokenizeQueue
from tests.waiting import wait_until

SLOW_S = 1.0   # what a job of the slow client "takes" on the fake clock


def order_of(slow_s: float) -> list[str]:
    """The order four jobs run in, queued while a fifth holds the thread: two of client a,
    whose jobs take `slow_s`, then two of client b, whose take nothing."""
    now = [0.0]
    ran: list[str] = []
    hold = threading.Event()

    def tokenize(ident: bytes, msg: Generate) -> list[int]:
        if msg.request_id == "hold":
            hold.wait(10)
        ran.append(msg.request_id)
        now[0] += slow_s if ident == b"a" else 0.0
        return [1]

    q = TokenizeQueue(tokenize, lambda: None, clock=lambda: now[0])
    try:
        q.submit(b"c", Generate(request_id="hold", prompt="x"))
        wait_until(lambda: q._vtime == 0.0 and not q._queues, 10, what="the hold to run")
        for ident, rid in ((b"a", "a1"), (b"a", "a2"), (b"b", "b1"), (b"b", "b2")):
            q.submit(ident, Generate(request_id=rid, prompt="same length"))
        hold.set()
        wait_until(lambda: len(ran) == 5, 10, what="every job to run")
        return ran[1:]
    finally:
        q.close()


def test_jobs_of_equal_cost_take_turns():
    assert order_of(0.0) == ["a1", "b1", "a2", "b2"]


def test_a_client_whose_job_ran_long_waits_behind_the_others():
    assert order_of(SLOW_S) == ["a1", "b1", "b2", "a2"]
