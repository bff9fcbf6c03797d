"""The worker's CPU threads: how many it runs (`scripts/serve --threads N`) and how its idle
OpenMP threads wait between parallel regions.

Every worker process (each --dp replica, each --tp rank) runs its torch ops and the C
kernels of worker/csrc/ in torch's one OpenMP pool (libgomp), `torch.get_num_threads()`
threads wide. By default the machine's cores (its CPU affinity) are shared out evenly:
cores // (replicas x ranks on this machine), at least 1, so that the group never runs more
spinning threads than there are cores.

libgomp's idle threads spin by default (GOMP_SPINCOUNT 300000, about a millisecond per
wait) before they sleep. A decode step is hundreds of short parallel regions, so on a
machine whose cores are also busy with something else (another replica, the core
process, any other load) a spinning thread holds a core that the thread which has work
needs, and a step took 7-20x longer. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a
wake-up in each region instead: on a quiet machine a 1B model's step took 1.2x longer
than with a short spin. So the default is chosen where the worker starts: a short spin
(SHORT_SPIN, some microseconds) where the machine's recent load leaves the worker's
threads their cores, the passive wait where it does not. "The load" is what other
programs keep busy now (LoadProbe: serve measures it before it starts any process of its
own and gives each worker the policy); a worker started alone falls back on the 1-minute
load average. libgomp reads its wait policy once, when it is loaded, so set_wait_policy
must run before torch is imported; a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is
kept. docs/design/processes.md ("Threads") has the measurements.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, MutableMapping

# Past this many threads per core of the affinity mask a setting is a typo, not a choice.
MAX_THREADS_PER_CORE = 4
# The variables by which a user chooses the wait policy themself.
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# Idle threads sleep at once: the default on a busy machine (docs/design/processes.md,
# "Threads").
DEFAULT_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
# Idle threads spin a few microseconds, long enough to span the gap between two parallel
# regions of a step, then sleep: the default where the cores are the worker's.
SHORT_SPIN = {"GOMP_SPINCOUNT": "3000"}
# The 1-minute load average under which `threads` threads have their cores: below
# cores - threads + LOAD_SLACK (a quiet machine's load is a few tenths, not 0).
LOAD_SLACK = 0.5


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def default_threads(replicas: int, ranks: int, ncores: int) -> int:
    """Each worker process's share of the cores: `replicas` engines of `ranks` processes
    each run on them at once."""
    return max(1, ncores // max(1, replicas * ranks))


def threads_problem(threads: int | None, ncores: int) -> str | None:
    """Why --threads cannot be so, or None (None means the default)."""
    if threads is None:
        return None
    if threads < 1:
        return f"--threads must be at least 1, not {threads}"
    if threads > MAX_THREADS_PER_CORE * ncores:
        return (f"--threads {threads} is over {MAX_THREADS_PER_CORE} threads per core of the"
                f" {ncores} this process may use")
    return None


def default_wait(threads: int, ncores: int, load: float) -> dict[str, str]:
    """The wait policy for `threads` threads on `ncores` cores under this 1-minute load:
    a short spin where the others' load leaves the threads their cores, else passive."""
    if load < ncores - threads + LOAD_SLACK:
        return dict(SHORT_SPIN)
    return dict(DEFAULT_WAIT)


def chosen_by_user(environ: Mapping[str, str]) -> bool:
    """Whether the environment names a wait policy (the user's, kept whatever the load)."""
    return any(name in environ for name in WAIT_ENV)


def set_wait_policy(environ: MutableMapping[str, str] = os.environ, threads: int = 1,
                    ncores: int = 1, load: float | None = None) -> dict[str, str]:
    """Put the default wait policy for `threads` threads into `environ` unless the user
    chose one of their own; returns what it set. `load`: the 1-minute load average (read
    here when None). Must run before torch (and so libgomp) is loaded."""
    return set_unless_chosen(
        environ, default_wait(threads, ncores, os.getloadavg()[0] if load is None else load))


def set_unless_chosen(environ: MutableMapping[str, str], policy: Mapping[str, str]) -> dict:
    """Put `policy` into `environ` unless the user chose a wait policy of their own; returns
    what it set. Must run before torch (and so libgomp) is loaded."""
    if chosen_by_user(environ):
        return {}
    environ.update(policy)
    return dict(policy)


def described(threads: int, environ: Mapping[str, str] = os.environ) -> dict:
    """What stats() says of the worker's threads: their count and the wait policy in force
    (`name=value` of the variables set, "libgomp default" where none is)."""
    wait = ", ".join(f"{n}={environ[n]}" for n in WAIT_ENV if n in environ)
    return {"count": threads, "wait": wait or "libgomp default"}


def use_threads(threads: int) -> None:
    """The width of this process's OpenMP pool, which the kernels read per call."""
    import torch
    torch.set_num_threads(threads)


# A probe's shortest window: /proc/stat counts in ticks of 10 ms, so 0.1 s on 2 cores is
# 20 ticks, fine enough for a threshold half a core wide.
PROBE_WINDOW_S = 0.1


def cpu_ticks(cpus: frozenset[int], stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, all) clock ticks of these CPUs since boot, or None where /proc/stat cannot
    be read (not Linux). Busy is all but idle and iowait; steal counts as busy (another
    guest held the core)."""
    try:
        lines = open(stat).read().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]   # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def own_cpu_s() -> float:
    """This process's CPU seconds so far (all its threads)."""
    t = os.times()
    return t.user + t.system


class LoadProbe:
    """The cores that other programs keep busy, measured from the probe's creation to
    `others()`: the busy ticks of the cores this process may use, less this process's own
    CPU time meanwhile. serve starts one before anything else and reads it just before it
    starts the engine's processes: the load *now*, where the 1-minute load average still
    carries whatever ran in the last minute (a benchmark's previous system, a build) and
    gave the worker the slower passive wait for its whole life."""

    def __init__(self, ticks: Callable[[], tuple[int, int] | None] | None = None,
                 own: Callable[[], float] = own_cpu_s, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        cpus = frozenset(os.sched_getaffinity(0))
        self._ticks = ticks or (lambda: cpu_ticks(cpus))
        self._own, self._clock, self._sleep = own, clock, sleep
        self._hz = os.sysconf("SC_CLK_TCK")
        self._ncpu = len(cpus)
        self._start = (self._clock(), self._ticks(), self._own())

    def others(self) -> float:
        """Busy cores, not counting this process, over at least PROBE_WINDOW_S; the
        1-minute load average where the ticks cannot be read."""
        began, ticks0, own0 = self._start
        if ticks0 is None:
            return os.getloadavg()[0]
        self._sleep(max(0.0, began + PROBE_WINDOW_S - self._clock()))
        ticks1, own1 = self._ticks(), self._own()
        if ticks1 is None or ticks1[1] <= ticks0[1]:
            return os.getloadavg()[0]
        window_s = (ticks1[1] - ticks0[1]) / self._hz / self._ncpu
        busy_s = (ticks1[0] - ticks0[0]) / self._hz - (own1 - own0)
        return max(0.0, busy_s / window_s)


def wait_for_workers(threads: int, ncores: int, others: Callable[[], float],
                     environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The wait policy serve gives its workers: none where the user chose one (they
    inherit it), else default_wait at the load others() measures."""
    if chosen_by_user(environ):
        return {}
    return default_wait(threads, ncores, others())
