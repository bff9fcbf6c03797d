"""What `scripts/bench compare` shares between its transformers phases (compare.py) and its
llama.cpp peer (_compare_peer.py): the engine's process group, rounds and turns, greedy
agreement. Both import this; neither imports the other's internals.

Turns: the systems compared run the workload in consecutive rounds, every system one round's
slice before the next round starts, who goes first rotating round by round, so that this
machine's drift in speed (10-30% within minutes) lands on all alike (docs/design/benchmarks.md,
"llama.cpp as a peer").
"""
from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks import common as bl
from scripts.benchmarks.prefix import hit_rate

ENGINE_BLOCK = 16
WARM_LEN = 32


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def blocks(reqs, size: int, spare: int = 1) -> int:
    return sum(math.ceil((len(r.prompt) + r.max_tokens) / size) + spare for r in reqs)


def warmup(reqs) -> list[bl.Req]:
    """Two short requests to warm a system up. Their prompts are reversed heads of the
    workload's: no prefix of any workload prompt, so they leave nothing in a cache that the
    workload could hit."""
    return [bl.Req(r.prompt[:WARM_LEN][::-1], 4) for r in reqs[:2]]


def split(reqs: list, n: int) -> list[list]:
    """`reqs` as n consecutive slices of near-equal length (fewer where it holds fewer)."""
    n = max(1, min(n, len(reqs)))
    cuts = [len(reqs) * i // n for i in range(n + 1)]
    return [reqs[x:y] for x, y in zip(cuts, cuts[1:])]


def turns(systems, n_rounds: int) -> list[tuple]:
    """Each round's order: the systems rotated by the round's index, so that each goes
    first, second, ... in turn."""
    s = tuple(systems)
    return [s[i % len(s):] + s[:i % len(s)] if s else () for i in range(n_rounds)]


def merged(runs: list[bl.RunResult]) -> bl.RunResult:
    """Rounds as one run: traces in workload order, the walls summed."""
    return bl.RunResult([t for r in runs for t in r.traces], sum(r.wall for r in runs),
                        runs[0].stats_before, runs[-1].stats_after)


def prefix_hits(run: bl.RunResult) -> dict:
    """The engine's prefix-cache tokens over the run (its stats() before and after)."""
    return hit_rate(run.stats_before, run.stats_after)


# The 1-minute load average under which a level starts: the engine's worker chooses its
# threads' wait policy from it when it starts (worker/threads.py), so a level must not start
# on the load of the level before; both systems start on the same settled machine.
SETTLED_LOAD = 0.5
SETTLE_SECONDS = 240


def settle(limit: float = SETTLED_LOAD, timeout: float = SETTLE_SECONDS) -> float:
    """Wait until the 1-minute load average is under `limit` (at most `timeout` s); the
    load it starts on, which the JSON records."""
    deadline = time.monotonic() + timeout
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(5)
    return round(os.getloadavg()[0], 2)


def start_engine(a, reqs):
    """A fresh process group (fp32, a KV pool the whole workload fits), warmed up; and its
    serve args."""
    from scripts.group.harness import start_group
    extra = a.engine_args.split()
    log = "--no-log" not in extra
    extra = [x for x in extra if x != "--no-log"]
    args = ["--model", a.model, "--dtype", "float32",
            "--num-blocks", str(blocks(reqs, ENGINE_BLOCK)), *extra]
    g = start_group(Path(tempfile.mkdtemp(prefix="tl-bench-compare-")), args, log=log)
    try:
        asyncio.run(bl.drive(g.address, warmup(reqs), progress=False, ignore_eos=True))
    except BaseException:
        g.stop()
        raise
    return g, args


def agreement(engine: list, other: list) -> dict:
    """Fraction of requests (that both ran) with identical tokens, and the mean fraction
    of each request's tokens before the first difference."""
    pairs = [(e, o) for e, o in zip(engine, other) if e is not None and o is not None]
    if not pairs:
        return {"compared": 0, "equal_frac": None, "prefix_frac": None}

    def prefix(e, o):
        n = next((i for i, (x, y) in enumerate(zip(e, o)) if x != y), min(len(e), len(o)))
        return n / max(len(e), len(o), 1)
    return {"compared": len(pairs), "equal_frac": sum(e == o for e, o in pairs) / len(pairs),
            "prefix_frac": sum(prefix(e, o) for e, o in pairs) / len(pairs)}
