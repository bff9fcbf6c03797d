#!/usr/bin/env python
"""Structured outputs' cost: every request in flight under its own JSON schema against the
same requests unconstrained, with and without overlapped scheduling (docs/structured.md,
"Measuring it").

    scripts/bench structured --json /tmp/structured-smollm2.json
    scripts/bench structured --quick --model tiny       # a smoke run

The workload: --requests chat questions on the trained model, each asking for one JSON object
under its own schema (scripts/benchmarks/_schemas.py), all sent at t=0, greedy, EOS ignored.
A calibration run (constrained, EOS not ignored) gives each request's length, its JSON to the
grammar's end: both sides then run to exactly that many tokens, so the throughput ratio
compares the same work. Two warm groups, one overlapped and one with --no-overlap, the
prefix cache off in both; four systems (constrained or not, in either group) take turns
round by round, who goes first rotating. Every measured constrained request's schema has a
title of its own, so its grammar is built in the worker's step as where each request brings
a new schema. The worker writes its time and its grammars' time per step (TL_WORKER_TIMES):
the mask's share of a step. Compile times, cold and cached, are measured in this process on
the model's tokenizer with the worker's code (_structured_compile.py). Unknown flags go to
scripts/serve (both groups).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from core import cli
from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import _report_tables as rt
from scripts.benchmarks import _structured_work as sw
from scripts.benchmarks._structured_compile import compile_times
from scripts.benchmarks import _worker_times as wt
from scripts.benchmarks import common as bl

GOAL = 0.9                # constrained / unconstrained throughput, overlapped
GROUPS = {"overlap": [], "no_overlap": ["--no-overlap"]}
SYSTEMS = {"constrained": ("overlap", True), "unconstrained": ("overlap", False),
           "constrained_no_overlap": ("no_overlap", True),
           "unconstrained_no_overlap": ("no_overlap", False)}
QUICK = {"requests": 8, "max_tokens": 16, "rounds": 2}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench structured", description=__doc__.split("\n")[0],
                   epilog="Unknown flags are passed to scripts/serve (both groups).")
    p.add_argument("--model", default="smollm2",
                   help="the model to serve (smollm2 | tiny | smol | PATH)")
    p.add_argument("--requests", type=int, default=64,
                   help="requests in flight, each under its own schema")
    p.add_argument("--max-tokens", type=int, default=128,
                   help="the longest output; each request runs to its calibrated length")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds, each system running every request once per round")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 8 requests, 16 tokens, 2 rounds")
    bl.add_run_options(p)
    a, rest = p.parse_known_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    if a.requests < 1 or a.max_tokens < 1 or a.rounds < 1:
        p.error("--requests, --max-tokens and --rounds must be at least 1")
    return a, rest


@dataclass
class Group:
    """A running process group and the file its worker writes its step times to."""
    handle: object
    times: Path


@dataclass
class Measured:
    """One system's turns: the client's runs and the worker's steps."""
    runs: list[bl.RunResult] = field(default_factory=list)
    steps: list[wt.StepTime] = field(default_factory=list)


def open_group(a, name: str, serve_args: list[str], w: sw.Workload) -> Group:
    from scripts.group.harness import start_group
    from worker.process import TIMES_ENV
    tmp = Path(tempfile.mkdtemp(prefix=f"tl-bench-structured-{name}-"))
    blocks = sum(math.ceil((len(it.prompt) + a.max_tokens) / cs.ENGINE_BLOCK) + 1
                 for it in w.items)
    args = ["--model", a.model, "--no-prefix-cache", "--num-blocks", str(blocks),
            *GROUPS[name], *serve_args]
    g = Group(start_group(tmp, args, log=False, timeout=600,
                          env={TIMES_ENV: str(tmp / "worker-times.txt")}),
              tmp / "worker-times.txt")
    try:
        asyncio.run(bl.drive(g.handle.address, sw.warmup(w), progress=False, ignore_eos=True))
    except BaseException:
        g.handle.stop()
        raise
    return g


def settled(times: Path, quiet_s: float = 0.3, limit_s: float = 10.0) -> int:
    """The times file's line count once no line came for `quiet_s`: overlapped, the worker
    may still run the step after the last tokens (docs/structured.md), and it belongs to
    the pass that made it."""
    n, deadline = wt.count(times), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        m = wt.count(times)
        if m == n:
            return n
        n = m
    return n


def one_pass(a, g: Group, reqs: list[bl.Req], label: str, **opts) -> tuple:
    mark = settled(g.times)
    run = asyncio.run(bl.drive(g.handle.address, reqs, timeout=a.timeout,
                               progress=a.progress, label=label, **opts))
    settled(g.times)
    return run, wt.read(g.times, mark)


def step_figures(steps: list[wt.StepTime]) -> dict:
    """The worker's time per step, its grammars' part (builds, syncs, masks) and the rest:
    where the rest is slower than the free requests' steps, the grammars cost more than
    their own time (their threads beside the forward's)."""
    total = sum(t.ms for t in steps)
    return {"worker_steps": len(steps),
            "worker_ms_per_step": bl.summarize([t.ms for t in steps]),
            "mask_ms_per_step": bl.summarize([t.mask_ms for t in steps]),
            "rest_ms_per_step": bl.summarize([t.ms - t.mask_ms for t in steps]),
            "mask_share": sum(t.mask_ms for t in steps) / total if total else float("nan")}


def figures(m: Measured) -> dict:
    run = cs.merged(m.runs)
    return {**bl.metrics(run), **cs.prefix_hits(run), **step_figures(m.steps),
            "rounds": len(m.runs)}


def ratios(s: dict) -> dict:
    def over(x: str, y: str, *path: str) -> float:
        a, b = (rt.get(s[n], *(path or ("output_tok_s",))) for n in (x, y))
        return a / b if a is not None and b and math.isfinite(a / b) else float("nan")
    c, u = "constrained", "unconstrained"
    return {"constrained_over_unconstrained": over(c, u),
            "constrained_over_unconstrained_no_overlap":
                over(f"{c}_no_overlap", f"{u}_no_overlap"),
            "overlap_gain_constrained": over(c, f"{c}_no_overlap"),
            "overlap_gain_unconstrained": over(u, f"{u}_no_overlap"),
            "tpot_p50_constrained_over_unconstrained": over(c, u, "tpot_ms", "p50"),
            "worker_rest_constrained_over_unconstrained":
                over(c, u, "rest_ms_per_step", "mean")}


def measure(a, groups: dict[str, Group], w: sw.Workload, lengths: list[int]) -> dict:
    got = {name: Measured() for name in SYSTEMS}
    for r, order in enumerate(cs.turns(SYSTEMS, a.rounds)):
        for name in order:
            group, constrained = SYSTEMS[name]
            reqs = sw.requests(w, lengths, constrained, f"{name}-r{r}")
            run, steps = one_pass(a, groups[group], reqs, f"round {r + 1} {name}",
                                  ignore_eos=True)
            got[name].runs.append(run)
            got[name].steps += steps
    return {name: figures(m) for name, m in got.items()}


def run_all(a, serve_args: list[str], w: sw.Workload) -> dict:
    groups: dict[str, Group] = {}
    try:
        for name in GROUPS:
            cs.say(f"{name}: starting a group on {a.model} ...")
            groups[name] = open_group(a, name, serve_args, w)
        cs.say("calibration: the constrained requests to their grammars' end ...")
        cal, _ = one_pass(a, groups["overlap"], sw.requests(
            w, [a.max_tokens] * len(w.items), True, "calibration"), "calibration")
        lengths, calibration = sw.calibration(w, cal, a.max_tokens)
        return {"calibration": calibration, "lengths": lengths,
                "systems": measure(a, groups, w, lengths)}
    finally:
        for g in groups.values():
            g.handle.stop()


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    begun = prov.begin("structured", a.json, a.allow_dirty)
    w = sw.workload(a.model, a.requests)
    cs.say(f"compile times: {a.requests} schemas on {a.model}'s tokenizer ...")
    doc = {"model": a.model, "serve_args": serve_args, "machine": bl.machine(),
           "compile": compile_times(a.model, [it.schema for it in w.items])}
    doc.update(run_all(a, serve_args, w))
    doc["workload"] = {
        "requests": a.requests, "in_flight": a.requests, "max_tokens_cap": a.max_tokens,
        "rounds": a.rounds, "prompt_tokens": sum(len(it.prompt) for it in w.items),
        "output_tokens": sum(doc["lengths"]), "sampling": "greedy", "ignore_eos": True,
        "lengths": "each request's constrained output to the grammar's end (calibration)",
        "schemas": "scripts/benchmarks/_schemas.py schemas(requests), each titled anew "
                   "per request: its grammar built in the step", "prefix_cache": "off"}
    doc["ratios"] = ratios(doc["systems"])
    got = doc["ratios"]["constrained_over_unconstrained"]
    doc["goal"] = {"constrained_over_unconstrained_at_least": GOAL, "met": got >= GOAL}
    print(rt.structured(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, begun, a.model))
    s = doc["systems"].values()
    same = len({m["output_tokens"] for m in s}) == 1
    if not same:
        cs.say("the systems' output tokens differ: a request ended early or failed")
    return 0 if same and all(m["errors"] == 0 for m in s) else 1


if __name__ == "__main__":
    sys.exit(main())
