"""The worker's CPU threads (worker/threads.py): serve's --threads and its default reach
the worker's torch pool, the wait policy is set before torch loads, from the load other
programs make now (serve's probe of /proc/stat), and a user's own is kept, bad counts are
refused in one line, and the logits do not depend on the count."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from scripts import ROOT
from scripts.group.commands import commands, rank_commands
from scripts.group.supervisor import parse
from worker import __main__ as worker_main
from worker.handmade import Part, make_batch
from worker.load import make_runner
from scripts.group.supervisor import workers_env
from worker.threads import (DEFAULT_WAIT, MAX_THREADS_PER_CORE, SHORT_SPIN, LoadProbe, cores,
                            cpu_ticks, default_threads, default_wait, described, set_wait_policy,
                            threads_problem, wait_for_workers)

ENDPOINTS = ["--to-core", "ipc:///nowhere/a", "--from-core", "ipc:///nowhere/b"]


def test_the_default_shares_the_cores_among_the_worker_processes():
    assert default_threads(1, 1, 16) == 16
    assert default_threads(2, 1, 16) == 8
    assert default_threads(2, 4, 16) == 2
    assert default_threads(2, 1, 2) == 1
    assert default_threads(3, 1, 2) == 1   # never 0


def test_bad_thread_counts_are_refused():
    assert threads_problem(None, 2) is None and threads_problem(8, 2) is None
    assert "at least 1" in threads_problem(0, 2)
    assert "at least 1" in threads_problem(-3, 2)
    assert "per core" in threads_problem(MAX_THREADS_PER_CORE * 2 + 1, 2)


def test_serve_passes_each_worker_its_threads(capsys):
    assert _flag(commands(parse(["--threads", "3"]), "/tmp/x", None)["worker"]) == "3"
    assert _flag(commands(parse([]), "/tmp/x", None)["worker"]) == str(cores())
    dp = commands(parse(["--dp", "2"]), "/tmp/x", None)
    assert _flag(dp["worker0"]) == _flag(dp["worker1"]) == str(default_threads(2, 1, cores()))
    ranks = rank_commands(parse(["--tp", "4", "--nnodes", "2", "--node-rank", "1",
                                 "--dist-init", "tcp://127.0.0.1:1"]))
    assert {_flag(c) for c in ranks.values()} == {str(default_threads(1, 2, cores()))}
    for bad in ("0", "100000"):
        with pytest.raises(SystemExit):
            parse(["--threads", bad])
        assert "--threads" in capsys.readouterr().err


def _flag(cmd: list[str]) -> str:
    return cmd[cmd.index("--threads") + 1]


def test_the_wait_policy_is_the_default_unless_the_user_chose_one():
    env: dict[str, str] = {}
    assert set_wait_policy(env, threads=2, ncores=2, load=3.0) == DEFAULT_WAIT == env
    for own in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(own)
        assert set_wait_policy(env, threads=2, ncores=2, load=0.0) == {} and env == own


def test_threads_spin_briefly_only_where_the_load_leaves_them_their_cores():
    # a quiet 2-core machine: 2 threads spin briefly; a busy one (a `yes` beside: load 1)
    # or more threads than the load leaves cores for: they sleep at once
    assert default_wait(2, 2, 0.2) == SHORT_SPIN
    assert default_wait(2, 2, 1.0) == DEFAULT_WAIT
    assert default_wait(1, 2, 1.0) == SHORT_SPIN
    assert default_wait(8, 16, 7.0) == SHORT_SPIN
    assert default_wait(8, 16, 9.0) == DEFAULT_WAIT
    env: dict[str, str] = {}
    assert set_wait_policy(env, threads=2, ncores=2, load=0.1) == SHORT_SPIN == env


STAT = """cpu  900 0 90 9000 9 0 1 0 0 0
cpu0 100 5 20 1000 10 1 2 3 0 0
cpu1 200 0 30 2000 0 0 0 0 0 0
cpu2 7000 0 0 1 0 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""


def test_cpu_ticks_count_the_given_cores_busy_but_idle_and_iowait(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    # cpu0: busy 100+5+20+1+2+3 = 131 of 1141; cpu1: 230 of 2230; cpu2 is not ours
    assert cpu_ticks(frozenset({0, 1}), str(stat)) == (131 + 230, 1141 + 2230)
    assert cpu_ticks(frozenset({5}), str(stat)) is None
    assert cpu_ticks(frozenset({0}), str(tmp_path / "none")) is None


class FakeMachine:
    """/proc/stat's ticks and this process's CPU time over a 0.2 s window on 2 cores of
    100 ticks a second (40 ticks in all), `busy` of them busy, `own_s` of it this process."""
    def __init__(self, busy: int, own_s: float):
        self.calls, self.busy, self.own_s = 0, busy, own_s
        self.slept: list[float] = []

    def ticks(self):
        self.calls += 1
        return (0, 0) if self.calls == 1 else (self.busy, 40)

    def own(self):
        return 0.0 if self.calls <= 1 else self.own_s


@pytest.mark.parametrize("busy, own_s, others", [(0, 0.0, 0.0), (20, 0.0, 1.0),
                                                  (40, 0.0, 2.0), (30, 0.1, 1.0),
                                                  (10, 0.2, 0.0)])
def test_the_probe_counts_what_others_keep_busy(monkeypatch, busy, own_s, others):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    m = FakeMachine(busy, own_s)
    clock = iter([0.0, 0.03])
    probe = LoadProbe(ticks=m.ticks, own=m.own, clock=lambda: next(clock), sleep=m.slept.append)
    assert probe.others() == pytest.approx(others)
    assert m.slept == [pytest.approx(0.07)]   # the rest of its 0.1 s window


def test_the_probe_sees_a_busy_process_beside_it():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time
        time.sleep(0.3)   # the interpreter has started and spins
        assert LoadProbe().others() >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def test_serve_gives_its_workers_the_policy_of_the_load_now():
    assert wait_for_workers(2, 2, lambda: 0.1, environ={}) == SHORT_SPIN
    assert wait_for_workers(2, 2, lambda: 1.0, environ={}) == DEFAULT_WAIT
    own = {"OMP_WAIT_POLICY": "active"}   # the user's: the workers inherit it, nothing added
    assert wait_for_workers(2, 2, lambda: pytest.fail("not measured"), environ=own) == {}
    cmds = commands(parse(["--dp", "2"]), "/tmp/x", None)
    env = workers_env(cmds, SHORT_SPIN)
    assert env == {"worker0": SHORT_SPIN, "worker1": SHORT_SPIN}
    ranks = rank_commands(parse(["--tp", "4", "--nnodes", "2", "--node-rank", "1",
                                 "--dist-init", "tcp://127.0.0.1:1"]))
    assert set(workers_env(ranks, DEFAULT_WAIT)) == set(ranks)


def test_stats_say_the_threads_and_their_wait():
    assert described(2, {"GOMP_SPINCOUNT": "3000"}) == {"count": 2, "wait": "GOMP_SPINCOUNT=3000"}
    assert described(1, {}) == {"count": 1, "wait": "libgomp default"}


def test_the_worker_module_loads_no_torch_before_it_sets_the_wait_policy():
    # libgomp reads the policy once, when torch loads it
    code = "import sys, worker.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False"


def test_the_workers_threads_are_its_flag(monkeypatch):
    """python -m worker --threads 1: torch's pool is 1 wide when the model loads."""
    seen = []

    def fake_runner(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise ValueError("stop here")

    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")   # set_wait_policy leaves os.environ
    monkeypatch.setattr(worker_main, "die_with_parent", lambda: None)
    monkeypatch.setattr(worker_main, "sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr("worker.load.make_runner", fake_runner)
    before = torch.get_num_threads()
    try:
        assert worker_main.main([*ENDPOINTS, "--model", "tiny", "--threads", "1"]) == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
    with pytest.raises(SystemExit):
        worker_main.main([*ENDPOINTS, "--model", "tiny", "--threads", "0"])


@pytest.mark.parametrize("quantize", [None, "q4_0"])
def test_logits_are_the_same_bits_with_one_and_two_threads(quantize):
    runner = make_runner("tiny", num_blocks=32, batch_invariant=True, quantize=quantize)
    bs = runner.info.block_size
    prompts = [list(range(5, 40)), [7] * 20, list(range(300, 303))]
    batch = make_batch([Part(p, 0, len(p), [3 * i, 3 * i + 1, 3 * i + 2])
                        for i, p in enumerate(prompts)], bs)
    decode = make_batch([Part(p + [11], len(p), 1, [3 * i, 3 * i + 1, 3 * i + 2])
                         for i, p in enumerate(prompts)], bs, step=1)
    before = torch.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runner.kv.zero_()
            out[threads] = [runner.logits(batch).clone(), runner.logits(decode).clone()]
    finally:
        torch.set_num_threads(before)
    for one, two in zip(out[1], out[2]):
        assert torch.equal(one, two)
