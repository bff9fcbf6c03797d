#!/usr/bin/env python
"""What-if accuracy: record configuration A live, predict A and B from A's step log, run B
live with the same requests at the same offsets, and compare (docs/design/whatif.md, "What-if
replay").

    scripts/bench whatif --model smol --json whatif.json
    scripts/bench whatif --model smol --b "--max-seqs 8 --policy fcfs" --rate 3
    scripts/bench whatif --model tiny --quick                       # a smoke run (< 1 min)

Workload: --requests requests, prompt and output lengths uniform in --prompt-len and
--output-len, priorities 0, 1 and 2 at random, Poisson arrivals at --rate per second (pick a
rate above what A serves, so that the engine stays busy); greedy, EOS ignored, so every
request generates its max_tokens. --a and --b are scheduling flags of scripts/serve that
whatif also takes (--policy, --aging-steps, --max-seqs, --max-batch-tokens, --num-blocks,
--prefill, --max-chunk, --preempt-margin, --speculative ngram, --num-draft,
--spec-max-batch). Measured figures come from each run's own step
log, computed as the prediction's are (replay/runmetrics.py). Errors are (predicted -
measured) / measured; the goals: A from its own log within 5% on makespan and TTFT p50, B
within 10% on makespan, throughput and TTFT p50, per priority too; p99 errors as they are.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl

PRIORITIES = (0, 1, 2)
KEYS = ("makespan_s", "throughput_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
        "tpot_ms_p99", "queue_ms_p50", "queue_ms_p99")
GOALS = {"a": (("makespan_s", "ttft_ms_p50"), 0.05),
         "b": (("makespan_s", "throughput_tok_s", "ttft_ms_p50"), 0.10)}
QUICK = {"requests": 24, "prompt_len": "8-64", "output_len": "4-32", "rate": 40.0}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench whatif", description=__doc__.split("\n")[0],
                                epilog="Unknown flags are passed to scripts/serve (A and B).")
    p.add_argument("--model", default="smol",
                   help="the model to serve (tiny | smol | null | smollm2 | PATH)")
    p.add_argument("--requests", type=int, default=120, help="requests in the workload")
    p.add_argument("--prompt-len", default="16-512", help="LO-HI prompt tokens, uniform")
    p.add_argument("--output-len", default="16-256", help="LO-HI max_tokens, uniform")
    p.add_argument("--rate", type=float, default=1.5, help="arrivals per second")
    p.add_argument("--a", default="", help="configuration A's scheduling flags")
    p.add_argument("--b", default="--max-seqs 8 --policy fcfs", help="configuration B's")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {', '.join(f'{k} {v}' for k, v in QUICK.items())}")
    p.add_argument("--seed", type=int, default=0, help="the workload's random seed")
    p.add_argument("--keep", metavar="DIR", help="keep A's and B's step logs here")
    bl.add_run_options(p)
    a, serve_args = p.parse_known_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    return a, serve_args


def knobs(flags: str):
    """A configuration's flags as whatif's Knobs (refusing any other flag)."""
    from replay.simulate import KNOBS, Knobs
    p = argparse.ArgumentParser(prog="a configuration", add_help=False)
    p.add_argument("--policy", choices=["fcfs", "priority"])
    p.add_argument("--prefill", choices=["whole", "chunked"])
    p.add_argument("--speculative", choices=["ngram"])   # 'off' is no scripts/serve value
    for name in KNOBS:
        if name not in ("policy", "prefill", "speculative"):
            p.add_argument(f"--{name.replace('_', '-')}", type=int)
    a = p.parse_args(shlex.split(flags))
    return Knobs(**{k: getattr(a, k) for k in KNOBS})


def workload(a, tokens: tuple[int, int]) -> tuple[list[bl.Req], list[int]]:
    reqs = bl.random_workload(a.requests, a.seed, bl.parse_range(a.prompt_len),
                              bl.parse_range(a.output_len), tokens)
    bl.poisson_arrivals(reqs, a.rate, a.seed)
    rng = random.Random(f"priorities:{a.seed}")
    return reqs, [rng.choice(PRIORITIES) for _ in reqs]


async def send(address: str, reqs: list[bl.Req], prios: list[int], a, label: str) -> list[str]:
    """Every request at its offset, streamed to the end; the errors."""
    from frontend.client import AsyncClient

    async with AsyncClient(address, timeout=a.timeout) as c:
        bar = bl.Progress(len(reqs), label, a.progress)
        t0 = time.perf_counter()

        async def one(r: bl.Req, prio: int) -> str | None:
            await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
            try:
                async for _ in c.stream(r.prompt, max_tokens=r.max_tokens, priority=prio,
                                        ignore_eos=True):
                    pass
            except Exception as e:  # counted and reported, not fatal
                return f"{type(e).__name__}: {e}"
            finally:
                bar.tick()
            return None

        errors = await asyncio.gather(*(one(r, p) for r, p in zip(reqs, prios)))
    return [e for e in errors if e]


def run_live(a, serve_args: list[str], flags: str, reqs, prios, log: Path, label: str) -> list:
    from scripts.group.harness import start_group
    print(f"{label}: starting a group on {a.model} {flags} ...", file=sys.stderr, flush=True)
    group = start_group(log.parent, ["--model", a.model, *serve_args, *shlex.split(flags)],
                        log=log)
    try:
        return asyncio.run(send(group.address, reqs, prios, a, label))
    finally:
        group.stop()


def errors(pred: dict, meas: dict) -> dict:
    def rel(p, m):
        return None if p is None or not m else round((p - m) / m, 4)
    out = {k: rel(pred[k], meas[k]) for k in KEYS}
    out["by_priority"] = {p: {k: rel(pred["by_priority"].get(p, {}).get(k), m[k])
                              for k in ("ttft_ms_p50", "queue_ms_mean")}
                          for p, m in meas["by_priority"].items()}
    return out


def goals(doc: dict) -> dict:
    out = {}
    for run, (keys, bound) in GOALS.items():
        e = doc[run]["errors"]
        vals = [e[k] for k in keys]
        if run == "b":
            vals += [v["ttft_ms_p50"] for v in e["by_priority"].values()]
        out[run] = {"bound": bound, "met": all(v is not None and abs(v) <= bound for v in vals)}
    return out


def report(doc: dict) -> str:
    pct = lambda v: "-" if v is None else f"{v * 100:+.1f}%"  # noqa: E731
    rows = []
    for k in KEYS:
        a, b = doc["a"], doc["b"]
        rows.append((k, a["measured"][k], a["predicted"][k], pct(a["errors"][k]),
                     b["measured"][k], b["predicted"][k], pct(b["errors"][k])))
    for p, e in doc["b"]["errors"]["by_priority"].items():
        for k in ("ttft_ms_p50", "queue_ms_mean"):
            rows.append((f"priority {p} {k}", doc["a"]["measured"]["by_priority"][p][k],
                         doc["a"]["predicted"]["by_priority"].get(p, {}).get(k),
                         pct(doc["a"]["errors"]["by_priority"].get(p, {}).get(k)),
                         doc["b"]["measured"]["by_priority"][p][k],
                         doc["b"]["predicted"]["by_priority"].get(p, {}).get(k), pct(e[k])))
    lines = [bl.table(rows, ("", "A measured", "A predicted", "error", "B measured",
                             "B predicted", "error")),
             f"fit on A's log: R^2 {doc['fit']['r2']:.4f}, held-out MAPE "
             f"{doc['fit']['mape'] * 100:.2f}%"]
    for run, g in doc["goals"].items():
        lines.append(f"goal {run.upper()} (within {g['bound'] * 100:.0f}%): "
                     f"{'met' if g['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from replay.logfile import LogFile
    from replay.whatif import predict, recorded_figures
    a, serve_args = parse(argv)
    start = prov.begin("whatif", a.json, a.allow_dirty)
    kb = knobs(a.b)
    knobs(a.a)   # refuse a flag whatif could not predict, before anything runs
    facts = bl.model_facts(a.model)
    reqs, prios = workload(a, bl.safe_token_range(facts["vocab_size"], facts["eos_ids"]))
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="tl-bench-whatif-"))
    tmp.mkdir(parents=True, exist_ok=True)
    logs = {run: tmp / run / "steps.db" for run in ("a", "b")}   # serve.stderr beside each
    for path in logs.values():
        path.parent.mkdir(exist_ok=True)
        path.unlink(missing_ok=True)
    failed = run_live(a, serve_args, a.a, reqs, prios, logs["a"], "A")
    log_a = LogFile(str(logs["a"]))
    t0 = time.perf_counter()
    pred_a, pred_b = predict(log_a), predict(log_a, kb)
    predict_s = (time.perf_counter() - t0) / 2
    failed += run_live(a, serve_args, a.b, reqs, prios, logs["b"], "B")
    meas_a, meas_b = pred_a.doc["recorded"], recorded_figures(LogFile(str(logs["b"])))
    doc = {"model": a.model, "serve_args": serve_args, "a_flags": a.a, "b_flags": a.b,
           "machine": bl.machine(), "logs": {k: str(v) for k, v in logs.items()},
           "workload": {**bl.describe(reqs), "rate": a.rate, "prompt_len": a.prompt_len,
                        "output_len": a.output_len, "priorities": list(PRIORITIES),
                        "seed": a.seed},
           "fit": pred_a.doc["fit"], "predict_s": round(predict_s, 3), "request_errors": failed[:5],
           "a": {"measured": meas_a, "predicted": pred_a.doc["predicted"],
                 "errors": errors(pred_a.doc["predicted"], meas_a)},
           "b": {"measured": meas_b, "predicted": pred_b.doc["predicted"],
                 "errors": errors(pred_b.doc["predicted"], meas_b)}}
    doc["goals"] = goals(doc)
    print(report(doc))
    print(f"prediction took {predict_s:.2f} s; step logs in {tmp}")
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
