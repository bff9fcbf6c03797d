"""The frontend's two preparation threads (frontend/prompts.py; docs/structured.md, "The compile
budget"): a constraint without a verdict is compiled for a thread of its own, by a background
process, and then tokenized; while it compiles, another client's plain prompt is tokenized
and comes out first; a kept verdict skips the compile thread; a compile's failure is the
client's 400 and the client's budget its 429."""
from __future__ import annotations

import json
import os
import threading
import time

from core.ipc.protocol import Constraint, Generate, ModelInfo
from core.thread_nice import BACKGROUND_NICE
from frontend.prompts import Prompts
from tests.frontend.test_compile_check import new_slow_schema
from tests.waiting import wait_until
from worker.presets import preset_dir


class Replies:
    def __init__(self):
        self.errors: list[tuple[bytes, str, int, str]] = []

    def error(self, ident, rid, code, message, field=None):
        self.errors.append((ident, rid, code, message))

    def aborted(self, ident, delta):
        self.errors.append((ident, delta.request_id, 0, "abort"))


class Prepared:
    """A Prompts on the tiny preset's tokenizer; `wait(n)` the first n jobs out of `done`,
    in the order they came out."""

    def __init__(self, per_s: float = 8.0):
        self.replies, self.out = Replies(), []
        self.wake = threading.Event()
        self.prompts = Prompts(5000, per_s, self.wake.set, self.replies)
        info = ModelInfo(model="tiny", num_blocks=8, block_size=16, max_model_len=256,
                         vocab_size=512, eos_ids=[0], tokenizer=str(preset_dir("tiny")))
        self.prompts.load(info)

    def submit(self, ident: bytes, rid: str, **extra) -> None:
        msg = Generate(request_id=rid, prompt="hello there", max_tokens=4, **extra)
        assert self.prompts.prepare(ident, msg, None) is None

    def settled(self, n: int) -> bool:
        self.out += [job.msg.request_id for job in self.prompts.done()]
        return len(self.out) + len(self.replies.errors) >= n

    def wait(self, n: int) -> list[str]:
        wait_until(lambda: self.settled(n), 30, what=f"{n} jobs out")
        return self.out


def slow_schema(title: str) -> dict:
    """structured_outputs of a new schema slow to compile."""
    return {"json": json.dumps(new_slow_schema(title))}


def test_a_new_constraint_compiles_niced_and_a_plain_prompt_passes_it():
    p = Prepared()
    try:
        p.submit(b"a", "slow", structured_outputs=slow_schema("a"))
        time.sleep(0.02)   # the compile under way
        p.submit(b"b", "plain")
        assert p.wait(2) == ["plain", "slow"]
        assert p.replies.errors == []
        assert len(p.prompts) == 0
        threads = {t.name: t for t in threading.enumerate()}
        assert "compile" in threads and "tokenize" in threads
    finally:
        p.prompts.close()


def test_the_compile_runs_in_a_background_process_and_the_threads_do_not():
    """The compile process is SCHED_IDLE and niced (frontend/compile_process.py); the two
    threads, which only wait for it or tokenize, keep the frontend's priority."""
    from core.thread_nice import is_background, niceness_of_this_thread
    seen = {}
    p = Prepared()
    try:
        base = niceness_of_this_thread()
        for q in p.prompts._queues:   # each queue's thread reports its own niceness
            done = threading.Event()
            q._tokenize = lambda ident, msg, name=q._thread.name, done=done: (
                seen.__setitem__(name, (niceness_of_this_thread(), is_background())),
                done.set(), [1])[-1]
            q.submit(b"x", Generate(request_id=f"n-{q._thread.name}", prompt="x"))
            assert done.wait(10)
        assert seen == {"tokenize": (base, False), "compile": (base, False)}
        assert p.prompts._children._all == []   # none started before a constraint came
        p.prompts._children.compile(Constraint("regex", "[ab]"))
        [child] = p.prompts._children._all
        pid = child._proc.pid
        assert is_background(pid)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, base + BACKGROUND_NICE)
    finally:
        p.prompts.close()


def test_a_kept_verdict_skips_the_compile_thread():
    p = Prepared()
    try:
        schema = {"regex": "[ab]{3}"}
        p.submit(b"a", "first", structured_outputs=schema)
        p.wait(1)
        compiles = p.prompts._compiles.compiles
        p.submit(b"a", "again", structured_outputs=schema)
        assert p.prompts._compile_queue.count_of(b"a") == 0
        assert p.prompts._queue.has(b"a", "again") or p.settled(2)
        assert p.wait(2) == ["first", "again"]
        assert p.prompts._compiles.compiles == compiles
    finally:
        p.prompts.close()


def test_a_failed_compile_and_an_empty_budget_answer_the_client():
    p = Prepared(per_s=0.01)   # a bucket of one
    try:
        p.submit(b"a", "bad", structured_outputs={"regex": "("})
        p.submit(b"a", "over", structured_outputs={"regex": "[cd]{2}"})
        p.wait(2)
        codes = {rid: code for _, rid, code, _ in p.replies.errors}
        assert codes == {"bad": 400, "over": 429}, p.replies.errors
        assert p.out == [] and len(p.prompts) == 0
    finally:
        p.prompts.close()


def test_an_abort_finds_a_job_on_either_thread():
    p = Prepared()
    try:
        p.submit(b"a", "slow", structured_outputs=slow_schema("abort"))
        assert p.prompts.has(b"a", "slow") and p.prompts.count_of(b"a") == 1
        p.prompts.abort(b"a", "slow")
        assert not p.prompts.has(b"a", "slow") and len(p.prompts) == 0
        assert p.replies.errors == [(b"a", "slow", 0, "abort")]
    finally:
        p.prompts.close()
