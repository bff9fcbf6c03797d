"""scripts/bench overhead's CPU split (scripts/benchmarks/_overhead_cpu.py): each process's
utime + stime read from /proc, sampled over a run, read over the steady steps' window and
divided per step and per delta; the step log's window (_overhead_log.steady_window); the
README's table of it (_report_tables.overhead_split). Fast, no group."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from scripts.benchmarks import _overhead_cpu as oc
from scripts.benchmarks import _report_tables as rt
from scripts.benchmarks._overhead_log import Window, steady_window


def _stat(comm: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"4242 ({comm}) S 1 4242 4242 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 3 0"


def test_cpu_seconds_are_utime_plus_stime_whatever_the_command_name():
    assert oc.parse_cpu_seconds(_stat("python", 250, 50), 100) == 3.0
    assert oc.parse_cpu_seconds(_stat("a) S 1 2 (b", 7, 3), 10) == 1.0   # ')' in the name


def test_this_process_cpu_grows_with_work_and_a_missing_pid_is_a_lookup_error():
    before = oc.cpu_seconds(os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    assert oc.cpu_seconds(os.getpid()) > before
    with pytest.raises(LookupError):
        oc.cpu_seconds(2 ** 22 + 7)   # past pid_max's largest value on Linux


def _samples(*rows) -> list[oc.Sample]:
    return [oc.Sample(t, dict(v)) for t, v in rows]


def test_values_are_read_between_samples_linearly_and_only_within_their_span():
    s = _samples((10.0, {"a": 1.0}), (12.0, {"a": 3.0}), (14.0, {"a": 3.0}))
    assert oc.value_at(s, "a", 10.0) == 1.0 and oc.value_at(s, "a", 11.5) == 2.5
    assert oc.value_at(s, "a", 13.0) == 3.0
    assert oc.used(s, 11.0, 14.0) == {"a": 1.0}
    with pytest.raises(ValueError, match="outside"):
        oc.value_at(s, "a", 14.5)


def test_per_divides_and_is_none_when_nothing_was_counted():
    assert oc.per(0.002, 100, 1e6) == 20.0
    assert oc.per(1.0, 0) is None


def test_the_split_gives_each_process_per_step_per_delta_and_busy():
    names = ("frontend", "core", "worker", "client")
    s = _samples((0.0, {**{n: 0.0 for n in names}, oc.RECEIVED: 0}),
                 (2.0, {"frontend": 1.0, "core": 0.5, "worker": 0.2, "client": 0.1,
                        oc.RECEIVED: 1000}),
                 (3.0, {"frontend": 1.2, "core": 0.6, "worker": 0.3, "client": 0.2,
                        oc.RECEIVED: 1200}))
    c = oc.split(s, Window(t0=0.0, t1=2.0, steps=10, deltas=2000))
    assert c["frontend_us_per_delta"] == pytest.approx(1000.0)   # 1 s over 1000 deltas
    assert c["client_us_per_delta"] == pytest.approx(100.0)
    assert c["core_ms_per_step"] == pytest.approx(50.0) and c["worker_ms_per_step"] == 20.0
    assert c["received_over_produced"] == 0.5 and c["busy"]["frontend"] == 0.5
    assert c["run"]["deltas_received"] == 1200
    assert c["run"]["frontend_us_per_delta"] == pytest.approx(1000.0)


def test_the_sampler_reads_pids_and_probes_until_stopped():
    count = {"n": 0}

    def probe():
        count["n"] += 1
        return count["n"]
    sampler = oc.Sampler({"me": os.getpid(), "gone": 2 ** 22 + 7}, {"p": probe},
                         every_s=0.01).start()
    time.sleep(0.1)
    samples = sampler.stop()
    assert len(samples) >= 3 and samples[-1].values["p"] == count["n"]
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert all(s.values["gone"] == 0.0 and s.values["me"] > 0 for s in samples)


def _row(step: int, t: float, decode: list[int], prefill=()):
    return SimpleNamespace(step=step, wall_time=t, schedule={"decode": decode,
                                                              "prefill": list(prefill)},
                           outputs=[[i, 7, False] for i in [*prefill, *decode]])


def test_the_steady_window_spans_the_full_steps_after_the_warm_ones():
    rows = [_row(0, 0.0, [], prefill=[0, 1])]
    rows += [_row(k, k * 0.01, [0, 1]) for k in range(1, 20)]
    rows += [_row(20, 0.3, [1])]
    w = steady_window(rows, 2)
    first = 1 + 5   # the first full step after the 5 warm-up ones
    assert (w.t0, w.t1) == (first * 0.01, 19 * 0.01)
    assert w.steps == 19 - first and w.deltas == 2 * w.steps
    assert w.seconds == pytest.approx((19 - first) * 0.01)


def test_the_readme_shows_the_split_only_where_the_json_has_it():
    cpu = {"core_ms_per_step": 1.5, "worker_ms_per_step": 0.25,
           "frontend_us_per_delta": 21.5, "client_us_per_delta": 2.0,
           "received_over_produced": 0.98,
           "busy": {"core": 0.7, "worker": 0.1, "frontend": 1.0, "client": 0.1}}
    doc = {"null_steps": 800, "null": {"256": {"step_ms": 3.9, "token_ms_at_client": 4.5,
                                                "cpu": cpu}},
           "asyncclient": {"streams": 1000, "step_ms": 9.0, "cpu": cpu, "errors": 3,
                           "frontend_dropped_client": True}}
    text = rt.table(doc)
    assert ("| null model, 256 running (sink) | 3.90 | 4.50 | 1.50 | 0.25 | 21.5 | 2.0 |"
            " 0.70 / 0.10 / 1.00 / 0.10 | 0.98 |") in text
    assert "1000 streams on one AsyncClient | 9.00 | - |" in text
    assert "3 streams failed (the frontend dropped it)" in text
    older = {"null_steps": 800, "null": {"256": {"step_ms": 3.9}}}
    assert "CPU" not in rt.table(older) and "AsyncClient" not in rt.table(older)
