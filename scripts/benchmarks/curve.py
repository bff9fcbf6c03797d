#!/usr/bin/env python
"""What CurveZMQ costs per request: one null-model group with --curve and one without,
driven in alternating turns at 64 requests in flight (docs/security.md, "CurveZMQ").

    scripts/bench curve --json docs/bench/curve.json
    scripts/bench curve --turns 2 --requests 64 --allow-dirty    # a smoke run

Each turn sends --requests short requests (--max-tokens each) through one AsyncClient, at
most --inflight at once, and times them; the turns alternate plain, curve, plain, ... so
that drift in the machine's load falls on both. Reports microseconds per request (wall time
of a turn / its requests) per setting, its median over turns, and the difference.
Unknown flags go to scripts/serve (both groups).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from core import cli
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl

SETTINGS = ("plain", "curve")


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench curve", description=__doc__.split("\n")[0],
                   epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--turns", type=int, default=10, help="turns per setting")
    p.add_argument("--requests", type=int, default=1024, help="requests per turn")
    p.add_argument("--inflight", type=int, default=64, help="requests in flight at once")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens each request asks")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


async def turn(address: str, keys: dict, a) -> float:
    """Seconds per request over one turn."""
    from frontend.client import AsyncClient
    gate = asyncio.Semaphore(a.inflight)

    async def one(client, k: int) -> None:
        async with gate:
            await client.generate([1 + k % 50, 2, 3, 4], max_tokens=a.max_tokens,
                                  ignore_eos=True)

    async with AsyncClient(address, timeout=a.timeout, **keys) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, k) for k in range(a.requests)))
        return (time.perf_counter() - t0) / a.requests


def client_keys(root: Path) -> dict:
    return {"server_key": str(root / "server.key"),
            "client_key": str(root / "clients" / "client0.key_secret")}


def summary(per_request_s: list[float]) -> dict:
    us = [s * 1e6 for s in per_request_s]
    return {"us_per_request": us, "median_us": statistics.median(us),
            "min_us": min(us), "max_us": max(us)}


def main(argv=None) -> int:
    from scripts.group import keygen
    from scripts.group.harness import start_group
    a, serve_args = parse(argv)
    start = prov.begin("curve", a.json, a.allow_dirty)
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-curve-"))
    with contextlib.redirect_stdout(sys.stderr):   # keygen names the files it wrote
        keygen.main([str(tmp / "keys")])
    extra = {"plain": [], "curve": ["--curve", str(tmp / "keys")]}
    for n in SETTINGS:
        (tmp / n).mkdir()
    groups = {n: start_group(tmp / n, ["--model", "null", *extra[n], *serve_args], log=False)
              for n in SETTINGS}
    times: dict[str, list[float]] = {n: [] for n in SETTINGS}
    try:
        for t in range(a.turns):
            for n in SETTINGS if t % 2 == 0 else SETTINGS[::-1]:
                keys = client_keys(tmp / "keys") if n == "curve" else {}
                times[n].append(asyncio.run(turn(groups[n].address, keys, a)))
                print(f"turn {t} {n}: {times[n][-1] * 1e6:.1f} us/request", file=sys.stderr,
                      flush=True)
    finally:
        for g in groups.values():
            g.stop()
    doc = {"serve_args": serve_args, "machine": bl.machine(),
           "workload": {"turns": a.turns, "requests": a.requests, "inflight": a.inflight,
                        "max_tokens": a.max_tokens, "prompt_tokens": 4},
           "settings": {n: summary(times[n]) for n in SETTINGS}}
    doc["curve_cost_us_per_request"] = (doc["settings"]["curve"]["median_us"]
                                        - doc["settings"]["plain"]["median_us"])
    print(bl.table([(n, f"{m['median_us']:.1f}", f"{m['min_us']:.1f}", f"{m['max_us']:.1f}")
                    for n, m in doc["settings"].items()],
                   ("setting", "us/request p50", "min", "max")))
    print(f"CURVE costs {doc['curve_cost_us_per_request']:.1f} us per request")
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, "null"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
