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
threads their cores, the passive wait where it does not. libgomp reads its wait policy
once, when it is loaded, so set_wait_policy must run before torch is imported; a user's
own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept. docs/design/processes.md ("Threads") has
the measurements.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

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
    if any(name in environ for name in WAIT_ENV):
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
