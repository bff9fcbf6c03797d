#!/usr/bin/env python
"""Serving benchmark: a seeded workload through AsyncClient against a running group
(--address) or one this script starts (--model, plus any scripts/serve flags).

    scripts/bench serve --model smol --requests 64 --rate 4 --json out.json
    scripts/bench serve --address tcp://127.0.0.1:7600 --requests 256 --output-len 64-128
    scripts/bench serve --model tiny --num-blocks 96 --max-seqs 32   # serve flags pass through

Prompts are token ids (uniform in a range that avoids EOS), greedy, EOS ignored unless
--no-ignore-eos. All requests are sent at t=0 unless --rate gives Poisson arrivals.
Reports output tokens/s, requests/s, TTFT, TPOT, inter-token latency and end-to-end
latency (mean, p50, p90, p99) and the preemptions and steps the engine counted meanwhile.
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


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench serve", description=__doc__.split("\n")[0],
                                epilog="Unknown flags are passed to scripts/serve (with --model).")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--address", help="a running group's frontend address")
    src.add_argument("--model", help="start a group on this model (tiny|smol|null|PATH)")
    p.add_argument("--requests", "-n", type=int, default=64, help="requests in the workload")
    p.add_argument("--rate", type=float, default=0.0,
                   help="Poisson arrivals per second; 0 = all at t=0 (default)")
    p.add_argument("--prompt-len", default="16-512", help="LO-HI tokens, uniform")
    p.add_argument("--output-len", default="16-256", help="LO-HI max_tokens, uniform")
    p.add_argument("--workload", metavar="FILE.json",
                   help='[{"prompt": [ids] | "prompt_len": N, "max_tokens": M, "arrival": S}, ...]'
                        " (its first --requests entries)")
    p.add_argument("--seed", type=int, default=0, help="the workload's random seed")
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature")
    p.add_argument("--priority", type=int, default=0, help="every request's priority")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests end at EOS (by default they run to max_tokens)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: from the model)")
    prov.add_client_run_options(p)
    a, serve_args = p.parse_known_args(argv)
    if a.address and serve_args:
        p.error(f"serve flags {serve_args} need --model (this script starts the group)")
    if not a.address and not a.model:
        a.model = "tiny"
    if a.requests < 1 or a.rate < 0:
        p.error("--requests must be >= 1 and --rate >= 0")
    return a, serve_args


def token_range(a: argparse.Namespace, model: str | None) -> tuple[int, int]:
    if a.vocab:
        return bl.safe_token_range(a.vocab, [])
    try:
        facts = bl.model_facts(model)
    except Exception as e:
        raise SystemExit(f"bench serve: cannot read the vocabulary of model {model!r} ({e}); "
                         "pass --vocab") from None
    return bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])


def workload(a: argparse.Namespace, tokens: tuple[int, int]) -> list[bl.Req]:
    try:
        if a.workload:
            reqs = bl.file_workload(a.workload, a.seed, tokens)[:a.requests]
        else:
            reqs = bl.random_workload(a.requests, a.seed, bl.parse_range(a.prompt_len),
                                      bl.parse_range(a.output_len), tokens)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"bench serve: bad workload: {e}") from None
    if a.rate > 0:
        bl.poisson_arrivals(reqs, a.rate, a.seed)
    return reqs


async def model_of(address: str, timeout: float) -> dict:
    from frontend.client import AsyncClient
    async with AsyncClient(address, timeout=timeout) as c:
        return await c.stats()


def run(a: argparse.Namespace, address: str) -> tuple[dict, list[bl.Req]]:
    stats = asyncio.run(model_of(address, a.timeout))
    tokens = token_range(a, stats.get("model") or a.model)
    reqs = workload(a, tokens)
    res = asyncio.run(bl.drive(address, reqs, timeout=a.timeout, progress=a.progress,
                               temperature=a.temperature, priority=a.priority,
                               ignore_eos=a.ignore_eos))
    doc = bl.metrics(res)
    doc["engine"] = {"model": stats.get("model"), "total_blocks": stats.get("total_blocks"),
                     "max_model_len": stats.get("max_model_len")}
    arrivals = (f"Poisson {a.rate}/s" if a.rate else "from the file"
                if any(r.arrival for r in reqs) else "all at t=0")
    doc["workload"] = {**bl.describe(reqs), "seed": a.seed, "arrivals": arrivals,
                       "rate": a.rate or None,
                       "source": a.workload or {"prompt_len": a.prompt_len,
                                                "output_len": a.output_len},
                       "token_range": list(tokens), "temperature": a.temperature,
                       "ignore_eos": a.ignore_eos}
    return doc, reqs


def report(doc: dict) -> str:
    w = doc["workload"]
    head = [("model", doc["engine"]["model"]),
            ("requests (ok / sent)", f"{doc['completed']} / {doc['requests']}"),
            ("arrivals", w["arrivals"]),
            ("output tokens", doc["output_tokens"]), ("wall", f"{doc['wall_s']:.2f} s"),
            ("output tok/s", f"{doc['output_tok_s']:.1f}"),
            ("requests/s", f"{doc['requests_s']:.2f}"),
            ("preemptions", doc["preemptions"]), ("engine steps", doc["steps"])]
    lat = bl.table(bl.latency_rows(doc), ("latency", "mean", "p50", "p90", "p99"))
    errors = "".join(f"\n  error: {e}" for e in doc["first_errors"])
    return bl.table(head) + "\n" + lat + errors


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    start = prov.begin("serve", a.json, a.allow_dirty)
    group = None
    if not a.address:
        from scripts.group.harness import start_group
        tmp = Path(tempfile.mkdtemp(prefix="tl-bench-serve-"))
        log = "--no-log" not in serve_args
        serve_args = [x for x in serve_args if x != "--no-log"]
        print(f"starting a group on {a.model} ...", file=sys.stderr, flush=True)
        group = start_group(tmp, ["--model", a.model, *serve_args], log=log)
    try:
        doc, _ = run(a, a.address or group.address)
    finally:
        if group is not None:
            group.stop()
    doc["serve_args"] = serve_args if group is not None else None
    doc["step_log"] = str(group.log) if group is not None and group.log else None
    doc["machine"] = bl.machine()
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    return 0 if doc["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
