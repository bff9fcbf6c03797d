"""scripts/bench overhead's CPU figures: each process's CPU time (utime + stime of
/proc/PID/stat, every thread's, zmq's I/O threads included) sampled on a thread while a run
goes, with counters of the run's own (deltas received), and read over a window of wall time
as CPU seconds, so that a process's CPU per step or per delta is taken over the steady steps
alone, not the start-up and the tail."""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Callable

from core.ipc.lifeline import cpu_seconds as process_cpu_seconds
from core.ipc.lifeline import parse_cpu_seconds  # noqa: F401  (its tests read it here)

SAMPLE_S = 0.05    # 20 samples a second: the sampler's own CPU stays under 0.5% of a core


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used so far, all its threads (LookupError if gone)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise LookupError(f"no process {pid}")
    return seconds


@dataclass
class Sample:
    t: float                    # time.time(): the step log's clock
    values: dict[str, float]


@dataclass
class Sampler:
    """Samples each of `pids`' CPU seconds and each probe's value every SAMPLE_S, on a
    daemon thread, from start() to stop(). A process that is gone keeps its last value."""
    pids: dict[str, int]
    probes: dict[str, Callable[[], float]] = field(default_factory=dict)
    every_s: float = SAMPLE_S
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def start(self) -> "Sampler":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.samples

    def sample(self) -> None:
        last = self.samples[-1].values if self.samples else {}
        values = {}
        for name, pid in self.pids.items():
            try:
                values[name] = cpu_seconds(pid)
            except LookupError:
                values[name] = last.get(name, 0.0)
        values.update((name, float(probe())) for name, probe in self.probes.items())
        self.samples.append(Sample(time.time(), values))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()


def value_at(samples: list[Sample], name: str, t: float) -> float:
    """`name`'s value at time t, linear between the samples around it; t must lie within
    the samples' span (ValueError)."""
    times = [s.t for s in samples]
    if not samples or not times[0] <= t <= times[-1]:
        raise ValueError(f"time {t:.3f} is outside the samples' span")
    i = bisect_left(times, t)
    if times[i] == t:
        return samples[i].values[name]
    a, b = samples[i - 1], samples[i]
    return a.values[name] + (b.values[name] - a.values[name]) * (t - a.t) / (b.t - a.t)


def used(samples: list[Sample], t0: float, t1: float) -> dict[str, float]:
    """Each sampled name's increase from t0 to t1 (CPU seconds, or a probe's count)."""
    return {name: value_at(samples, name, t1) - value_at(samples, name, t0)
            for name in samples[0].values}


def per(total: float, count: float, scale: float = 1.0) -> float | None:
    """total / count x scale (e.g. CPU seconds per delta in us: scale 1e6); None when
    nothing was counted."""
    return total / count * scale if count > 0 else None


# ---------------------------------------------------------------- a run's split

# each process of the group by its command line (Group.pid_of); "client" is this process
PROCESSES = {"frontend": "-m frontend ", "core": "-m core ", "worker": "-m worker "}
RECEIVED = "received"   # the probe: deltas the client has read


def group_pids(group) -> dict[str, int]:
    return {name: group.pid_of(needle) for name, needle in PROCESSES.items()}


def split(samples: list[Sample], window) -> dict:
    """Each process's CPU over the steady `window` (_overhead_log.Window): the core's and
    the worker's per step, the frontend's and the client's per delta the client read in it
    (what the frontend managed to send: behind the core, it sends fewer than the steps
    made), and each one's share of one core's time (`busy`: 1.0 is a core always on)."""
    u = used(samples, window.t0, window.t1)
    got, steps, s = u[RECEIVED], window.steps, window.seconds
    return {"window_s": s, "steps": steps, "deltas_produced": window.deltas,
            "deltas_received": got,
            "received_over_produced": per(got, window.deltas),
            "frontend_us_per_delta": per(u["frontend"], got, 1e6),
            "client_us_per_delta": per(u["client"], got, 1e6),
            "frontend_ms_per_step": per(u["frontend"], steps, 1e3),
            "core_ms_per_step": per(u["core"], steps, 1e3),
            "worker_ms_per_step": per(u["worker"], steps, 1e3),
            "client_ms_per_step": per(u["client"], steps, 1e3),
            "busy": {name: per(u[name], s) for name in (*PROCESSES, "client")},
            "run": whole_run(samples)}


def whole_run(samples: list[Sample]) -> dict:
    """The frontend's and the client's CPU per delta read over the whole run, from the
    first request sent to the last delta read: a frontend behind the core sends the
    window's deltas after it, and this figure counts them all (and the requests'
    admission, a few deltas' worth each)."""
    u = used(samples, samples[0].t, samples[-1].t)
    return {"deltas_received": u[RECEIVED],
            "frontend_us_per_delta": per(u["frontend"], u[RECEIVED], 1e6),
            "client_us_per_delta": per(u["client"], u[RECEIVED], 1e6)}
