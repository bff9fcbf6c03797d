#!/usr/bin/env python
"""The worker's resident memory: a quantized GGUF model served on its blocks (the default)
against the same model served as float32 (`--dequantize`).

Each figure is a fresh process that makes the runner as the worker does (make_runner, a KV
pool of --num-blocks blocks), prefills a short prompt, runs --steps decode steps and reads
its VmRSS (and VmHWM, the peak) from /proc/self/status. The two settings take turns,
--rounds times; the medians and their ratio are printed. A second ratio leaves out the
runtime, what the process holds once the modules a load imports (torch, transformers) are
imported and before it reads a weight: the same in both settings (334 MB on smollm2),
which no format of the weights can shrink. RSS does not depend on the machine's load, so a
loaded machine changes the load times only.

    scripts/bench memory [--model smollm2] [--rounds 3] [--json FILE] [--checkout DIR]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from core import cli
from scripts import ROOT
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl

CHILD = Path(__file__).with_name("_memory_child.py")
SETTINGS = {"quantized": [], "dequantized": ["--dequantize"]}


def measure(checkout: Path, model: str, num_blocks: int, steps: int, flags: list[str]) -> dict:
    """One fresh process's figures (_memory_child.py) over `checkout`'s worker."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "-P", str(CHILD), model, str(num_blocks), str(steps), *flags]
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per setting, the median MB after the steps; and quantized over dequantized."""
    out = {}
    for name, rs in runs.items():
        out[name] = {k: statistics.median(r["after_steps"][k] for r in rs)
                     for k in rs[0]["after_steps"]}
        out[name]["load_s"] = statistics.median(r["load_s"] for r in rs)
        out[name]["runtime"] = statistics.median(r["imported"]["VmRSS"] for r in rs)
        out[name]["model"] = statistics.median(
            r["after_steps"]["VmRSS"] - r["imported"]["VmRSS"] for r in rs)
    out["ratio_rss"] = out["quantized"]["VmRSS"] / out["dequantized"]["VmRSS"]
    out["ratio_hwm"] = out["quantized"]["VmHWM"] / out["dequantized"]["VmHWM"]
    out["ratio_model"] = out["quantized"]["model"] / out["dequantized"]["model"]
    return out


def main() -> None:
    ap = cli.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a quantized GGUF model (registry "
                    "name or .gguf path)")
    ap.add_argument("--num-blocks", type=int, default=64, help="KV pool blocks")
    ap.add_argument("--steps", type=int, default=8, help="decode steps before reading")
    ap.add_argument("--rounds", type=int, default=1, help="fresh processes per setting, "
                    "the settings taking turns")
    ap.add_argument("--checkout", default=str(ROOT), help="the repository whose worker is "
                    "measured (another worktree: figures before and after a change)")
    ap.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(ap)
    a = ap.parse_args()
    checkout = Path(a.checkout).resolve()
    start = prov.begin("memory", a.json, a.allow_dirty, checkout)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    print(f"{a.model}, {a.num_blocks} KV blocks, {a.steps} decode steps; {checkout}")
    print(f"{'round':>5} {'setting':<12} {'VmRSS MB':>9} {'VmHWM MB':>9} {'anon MB':>8} "
          f"{'file MB':>8} {'runtime':>8} {'load s':>7}")
    for i in range(a.rounds):
        for name, flags in SETTINGS.items():
            r = measure(checkout, a.model, a.num_blocks, a.steps, flags)
            runs[name].append(r)
            s = r["after_steps"]
            print(f"{i:>5} {name:<12} {s['VmRSS']:>9.0f} {s['VmHWM']:>9.0f} "
                  f"{s['RssAnon']:>8.0f} {s['RssFile']:>8.0f} {r['imported']['VmRSS']:>8.0f} "
                  f"{r['load_s']:>7.1f}", flush=True)
    result = summary(runs)
    print(f"quantized / dequantized: VmRSS {result['ratio_rss']:.3f}, "
          f"VmHWM {result['ratio_hwm']:.3f}, over the runtime's {result['quantized']['runtime']:.0f}"
          f" MB (what the model adds) {result['ratio_model']:.3f}")
    if a.json:
        doc = {"num_blocks": a.num_blocks, "steps": a.steps, "rounds": a.rounds,
               "checkout": str(checkout), "summary": result, "runs": runs}
        bl.write_json(a.json, prov.stamp(doc, start, a.model, checkout))


if __name__ == "__main__":
    main()
