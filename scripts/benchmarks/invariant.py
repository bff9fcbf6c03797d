#!/usr/bin/env python
"""The batch-invariant mode's cost: the mixed workload served with and without
--batch-invariant, in one run (docs/design/cpu-paths.md, "Batch-invariant mode").

    scripts/bench invariant --model smol --json invariant.json
    scripts/bench invariant --model tiny --requests 4 --max-tokens 8    # a smoke run

Reports output tokens/s, TPOT and TTFT p50 per setting and the mode's cost: 1 - the
throughput ratio, and the TPOT ratio. Unknown flags go to scripts/serve (both settings).
`--profile STEPS` adds the share of each part of a step (linear layers, attention, the rest)
in both modes, from torch.profiler over STEPS steps of the same workload run in-process.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl

SETTINGS = {"off": [], "on": ["--batch-invariant"]}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench invariant",
                                description=__doc__.split("\n")[0],
                                epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smol",
                   help="the model to serve (tiny | smol | null | smollm2 | PATH)")
    p.add_argument("--requests", type=int, default=32, help="of the mixed workload")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap each request's output (a smoke run); default: the workload's")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="also profile STEPS in-process steps in each mode")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


def workload(a) -> list[bl.Req]:
    facts = bl.model_facts(a.model)
    reqs = bl.mixed_workload(a.requests, bl.safe_token_range(facts["vocab_size"],
                                                             facts["eos_ids"]))
    if a.max_tokens:
        for r in reqs:
            r.max_tokens = min(r.max_tokens, a.max_tokens)
    return reqs


def one(a, name: str, serve_args: list[str], reqs: list[bl.Req]) -> dict:
    from scripts.group.harness import start_group
    group = start_group(Path(tempfile.mkdtemp(prefix=f"tl-bench-invariant-{name}-")),
                        ["--model", a.model, *SETTINGS[name], *serve_args], log=False)
    try:
        run = asyncio.run(bl.drive(group.address, reqs, timeout=a.timeout, progress=a.progress,
                                   label=name, ignore_eos=True))
    finally:
        group.stop()
    return bl.metrics(run)


def profile(model: str, reqs: list[bl.Req], on: bool, steps: int) -> dict:
    """Milliseconds per step in the linear layers, the attention and the rest, over `steps`
    steps of the workload run in-process (after as many warm-up steps), serve's defaults."""
    import time

    from torch import nn
    from transformers import AttentionInterface

    from core.config import CoreConfig
    from core.ipc.protocol import SamplingParams
    from core.sched import Request
    from worker import attention
    from worker.load import make_runner

    spent = {"linear": 0.0, "attention": 0.0}

    def timed(fn, part):
        def run(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            spent[part] += time.perf_counter() - t
            return out
        return run

    runner = make_runner(model, batch_invariant=on)
    for m in runner.model.modules():
        if isinstance(m, nn.Linear):
            m.forward = timed(m.forward, "linear")
    AttentionInterface.register(attention.NAME, timed(attention.paged_attention, "attention"))
    try:
        engine = CoreConfig("", "", "", "").make_engine(runner.info)
        engine.runner = runner
        for r in reqs:
            engine.add(Request(list(r.prompt), r.max_tokens), SamplingParams(), ignore_eos=True)
        for _ in range(steps):
            engine.step()
        spent.update(linear=0.0, attention=0.0)
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total = time.perf_counter() - t
    finally:
        attention.register()
    ms = {k: v * 1e3 / steps for k, v in spent.items()}
    return {"step": total * 1e3 / steps, **ms,
            "other": total * 1e3 / steps - ms["linear"] - ms["attention"]}


def cost(s: dict) -> dict:
    off, on = s.get("off"), s.get("on")
    if not (off and on and off["output_tok_s"]):
        return {}
    return {"throughput on/off": on["output_tok_s"] / off["output_tok_s"],
            "cost (1 - throughput on/off)": 1 - on["output_tok_s"] / off["output_tok_s"],
            "TPOT p50 on/off": on["tpot_ms"]["p50"] / off["tpot_ms"]["p50"]
            if off["tpot_ms"]["p50"] else float("nan")}


def report(doc: dict) -> str:
    rows = [(n, f"{m['output_tok_s']:.1f}", bl._ms(m["tpot_ms"]["p50"]),
             bl._ms(m["tpot_ms"]["p99"]), bl._ms(m["ttft_ms"]["p50"]), m["errors"])
            for n, m in doc["settings"].items()]
    out = [bl.table(rows, ("mode", "out tok/s", "TPOT p50", "TPOT p99", "TTFT p50", "errors"))]
    out += [f"{k}: {v:.3f}" for k, v in doc["cost"].items()]
    for mode, shares in doc.get("profile", {}).items():
        out.append(f"profile {mode}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in shares.items()))
    return "\n".join(out)


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    start = prov.begin("invariant", a.json, a.allow_dirty)
    reqs = workload(a)
    doc = {"model": a.model, "serve_args": serve_args, "machine": bl.machine(),
           "workload": {**bl.MIXED, "requests": a.requests, "max_tokens_cap": a.max_tokens},
           "settings": {}}
    for name in SETTINGS:
        print(f"{name}: starting a group on {a.model} ...", file=sys.stderr, flush=True)
        doc["settings"][name] = one(a, name, serve_args, reqs)
    doc["cost"] = cost(doc["settings"])
    if a.profile:
        doc["profile"] = {name: profile(a.model, reqs, name == "on", a.profile)
                          for name in SETTINGS}
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    return 0 if all(m["errors"] == 0 for m in doc["settings"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
