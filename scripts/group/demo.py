"""scripts/demo: start a group on the tiny preset, send 64 concurrent requests, print a table.

Mixed prompt lengths, output lengths and priorities through AsyncClient, with a progress
bar; then requests, tokens, throughput, TTFT and TPOT percentiles, preemptions and the
mean wait per priority; stops the group and says where the step log is.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path


from frontend.client import AsyncClient
from scripts.group.harness import start_group
from scripts import ROOT

WORDS = ("the engine schedules every step again so that no sequence waits for the longest "
         "one in its batch while blocks of the paged cache come and go").split()


def workload(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 120))),
             "max_tokens": rng.randint(8, 96), "priority": rng.choice([0, 0, 0, 5, 10])}
            for _ in range(n)]


class Bar:
    def __init__(self, total: int):
        self.total, self.done = total, 0

    def tick(self) -> None:
        self.done += 1
        filled = 40 * self.done // self.total
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (40 - filled)}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


async def one(c: AsyncClient, req: dict, bar: Bar) -> dict:
    t0 = time.perf_counter()
    first, n = None, 0
    async for d in c.stream(req["prompt"], max_tokens=req["max_tokens"],
                            priority=req["priority"], ignore_eos=True):
        if d.token_ids and first is None:
            first = time.perf_counter()
        n += len(d.token_ids)
    end = time.perf_counter()
    bar.tick()
    tpot = (end - first) / (n - 1) if first and n > 1 else None
    return {"priority": req["priority"], "tokens": n, "ttft": (first or end) - t0, "tpot": tpot}


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


async def drive(address: str, reqs: list[dict]) -> tuple[list[dict], float, dict]:
    async with AsyncClient(address, timeout=300) as c:
        bar = Bar(len(reqs))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(c, r, bar) for r in reqs))
        wall = time.perf_counter() - t0
        stats = await c.stats()
    return results, wall, stats


def table(results: list[dict], wall: float, stats: dict) -> str:
    toks = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] * 1e3 for r in results]
    tpot = [r["tpot"] * 1e3 for r in results if r["tpot"] is not None]
    rows = [("requests", f"{len(results)}"), ("output tokens", f"{toks}"),
            ("wall time", f"{wall:.2f} s"), ("throughput", f"{toks / wall:.1f} tok/s"),
            ("TTFT p50 / p99", f"{pct(ttft, 50):.0f} / {pct(ttft, 99):.0f} ms"),
            ("TPOT p50 / p99", f"{pct(tpot, 50):.1f} / {pct(tpot, 99):.1f} ms"),
            ("preemptions", f"{stats.get('preemptions')}"),
            ("steps", f"{stats.get('steps')}")]
    for prio in sorted({r["priority"] for r in results}, reverse=True):
        w = [r["ttft"] * 1e3 for r in results if r["priority"] == prio]
        rows.append((f"mean wait, priority {prio}", f"{sum(w) / len(w):.0f} ms (n={len(w)})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--model", default="tiny")
    p.add_argument("--num-blocks", type=int, default=96, help="small enough to preempt")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    log = runs / time.strftime("demo-%Y%m%d-%H%M%S.db")
    print(f"starting the group ({a.model} preset, {a.num_blocks} KV blocks)...", flush=True)
    g = start_group(Path(tempfile.mkdtemp(prefix="tl-demo-")), log=log,
                    args=["--model", a.model, "--num-blocks", str(a.num_blocks)])
    try:
        print(f"ready at {g.address}; sending {a.requests} concurrent requests", flush=True)
        results, wall, stats = asyncio.run(drive(g.address, workload(a.requests, a.seed)))
    finally:
        code = g.stop()
    print(table(results, wall, stats))
    print(f"group stopped (exit {code}); step log: {log}")
    print(f"  explain it: scripts/replay summary {log}   verify it: scripts/replay verify {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
