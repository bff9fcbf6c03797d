#!/usr/bin/env python
"""Memory bandwidth: a STREAM-like triad and a read-only sum, with 1 and more threads.

    scripts/bench bandwidth [--size-mb 256] [--threads 1,2] [--runs 5] [--json FILE]

Triad: a = b + s*c (torch.add(b, c, alpha=s, out=a)) on three float32 arrays of --size-mb
each, far larger than the caches; counted as STREAM counts it, 3 arrays' bytes per pass
(2 read, 1 written; the write-allocate read is not counted). Sum: torch.sum(b), 1 array's
bytes read. Each figure is the best of --runs passes at each thread count, as STREAM
reports. A decode step reads the weights once per token, so bytes per token over TPOT as
a fraction of the triad says how near a system runs to what the memory gives
(`scripts/bench compare --peer llamacpp` runs triad() at its start for that).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from core import cli
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl

SCALAR = 3.0
MB = 1 << 20
DEFAULT_SIZE_MB = 256
DEFAULT_RUNS = 5


def _best_s(fn, runs: int) -> float:
    fn()   # the first pass faults the pages in
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(size_mb: int, threads: int, runs: int) -> dict:
    """Triad and sum GB/s (1e9 bytes) at `threads`, best of `runs`."""
    n = size_mb * MB // 4
    a, b, c = (torch.full((n,), v, dtype=torch.float32) for v in (0.0, 1.0, 2.0))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        triad = _best_s(lambda: torch.add(b, c, alpha=SCALAR, out=a), runs)
        total = _best_s(lambda: torch.sum(b), runs)
    finally:
        torch.set_num_threads(before)
    return {"threads": threads, "size_mb": size_mb, "triad_gb_s": 3 * 4 * n / triad / 1e9,
            "sum_gb_s": 4 * n / total / 1e9}


def parse(argv=None) -> argparse.Namespace:
    p = cli.parser(prog="scripts/bench bandwidth", description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=int, default=DEFAULT_SIZE_MB, help="MiB per array (3 arrays)")
    p.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and this machine's cores)")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="passes per figure; the best counts")
    p.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(p)
    a = p.parse_args(argv)
    cores = bl.machine()["usable_cores"]
    try:
        a.threads = sorted({int(t) for t in (a.threads or f"1,{cores}").split(",") if t})
    except ValueError:
        p.error(f"--threads: want comma-separated integers, got {a.threads!r}")
    if not a.threads or a.threads[0] < 1 or a.size_mb < 1 or a.runs < 1:
        p.error("--threads, --size-mb and --runs must be >= 1")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    start = prov.begin("bandwidth", a.json, a.allow_dirty)
    rows = [measure(a.size_mb, t, a.runs) for t in a.threads]
    doc = {"size_mb": a.size_mb, "arrays": 3, "runs": a.runs, "dtype": "float32",
           "scalar": SCALAR, "levels": rows, "machine": bl.machine()}
    print(f"  {a.size_mb} MiB x 3 float32 arrays, best of {a.runs}")
    print(bl.table([(r["threads"], f"{r['triad_gb_s']:.2f}", f"{r['sum_gb_s']:.2f}")
                    for r in rows], ("threads", "triad GB/s", "sum GB/s")))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
