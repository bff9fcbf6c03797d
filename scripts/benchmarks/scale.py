#!/usr/bin/env python
"""Scale-out benchmark: the mixed workload on data-parallel replicas and on tensor-parallel
ranks, every setting in one run (docs/design/processes.md, "Data-parallel replicas";
docs/design/worker.md, "Tensor parallel").

    scripts/bench scale --model smol --json scale.json
    scripts/bench scale --model smol --device cuda        # on a machine with GPUs
    scripts/bench scale --model tiny --requests 4          # a smoke run

Settings (torch threads per worker process via OMP_NUM_THREADS, so that on a 2-core machine
the comparison is at equal threads per replica):
  dp1  --dp 1, 1 thread          dp2  --dp 2, 1 thread per replica
  tp1  --tp 1, 2 threads         tp2  --tp 2, 1 thread per rank (the same total threads)
Reports output tokens/s and TTFT p50/p99 per setting, and the ratios dp2/dp1 and tp2/tp1.
A setting whose group does not start (smol's 9 heads cannot be split over 2 ranks) is
reported as refused; `--settings tp1,tp2 --model tiny` measures TP on a model it splits.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl

SETTINGS = {"dp1": (["--dp", "1"], 1), "dp2": (["--dp", "2"], 1),
            "tp1": (["--tp", "1"], 2), "tp2": (["--tp", "2"], 1)}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench scale", description=__doc__.split("\n")[0],
                                epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smol",
                   help="the model to serve (tiny | smol | null | smollm2 | PATH)")
    p.add_argument("--requests", type=int, default=32, help="of the mixed workload")
    p.add_argument("--settings", default=",".join(SETTINGS), help="which, comma-separated")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


def one(a, name: str, serve_args: list[str], reqs: list[bl.Req]) -> dict:
    from scripts.group.harness import start_group
    flags, threads = SETTINGS[name]
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)   # the group's processes inherit it
    try:
        group = start_group(Path(tempfile.mkdtemp(prefix=f"tl-bench-scale-{name}-")),
                            ["--model", a.model, *flags, *serve_args], log=False)
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old
    try:
        run = asyncio.run(bl.drive(group.address, reqs, timeout=a.timeout, progress=a.progress,
                                   label=name, ignore_eos=True))
    finally:
        group.stop()
    return {**bl.metrics(run), "flags": flags, "threads_per_process": threads}


def report(doc: dict) -> str:
    rows = [(n, m["threads_per_process"], f"{m['output_tok_s']:.1f}", bl._ms(m["ttft_ms"]["p50"]),
             bl._ms(m["ttft_ms"]["p99"]), m["errors"]) for n, m in doc["settings"].items()]
    out = [bl.table(rows, ("setting", "threads", "out tok/s", "TTFT p50", "TTFT p99", "errors"))]
    out += [f"{k}: {v:.2f}x" for k, v in doc["ratios"].items()]
    return "\n".join(out)


def ratios(s: dict) -> dict:
    out = {}
    for a, b in (("dp2", "dp1"), ("tp2", "tp1")):
        if a in s and b in s and s[b]["output_tok_s"]:
            out[f"throughput {a}/{b}"] = s[a]["output_tok_s"] / s[b]["output_tok_s"]
    return out


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    start = prov.begin("scale", a.json, a.allow_dirty)
    names = [n for n in a.settings.split(",") if n]
    unknown = set(names) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"bench scale: unknown settings {sorted(unknown)}")
    facts = bl.model_facts(a.model)
    reqs = bl.mixed_workload(a.requests, bl.safe_token_range(facts["vocab_size"], facts["eos_ids"]))
    doc = {"model": a.model, "serve_args": serve_args, "machine": bl.machine(),
           "workload": {**bl.MIXED, "requests": a.requests}, "settings": {}}
    for name in names:
        print(f"{name}: starting a group on {a.model} ...", file=sys.stderr, flush=True)
        try:
            doc["settings"][name] = one(a, name, serve_args, reqs)
        except RuntimeError as e:   # e.g. --tp 2 refused: heads not divisible by 2
            doc.setdefault("refused", {})[name] = str(e).splitlines()[-3:]
            print(f"{name}: the group did not start: {doc['refused'][name]}", file=sys.stderr)
    doc["ratios"] = ratios(doc["settings"])
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    ok = not doc.get("refused") and all(m["errors"] == 0 for m in doc["settings"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
