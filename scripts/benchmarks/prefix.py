#!/usr/bin/env python
"""Prefix-cache benchmark: the same workloads on a group with the cache and on one started
with --no-prefix-cache, in one run (docs/design/scheduler.md#prefix-cache).

    scripts/bench prefix --model smol --json prefix.json
    scripts/bench prefix --model tiny --requests 8 --conversations 2 --mixed 4   # a smoke run

Workloads (greedy, EOS ignored, token-id prompts):
  shared  --requests requests, one --system-len-token system prompt then 16-64 unique tokens,
          --output-len tokens each; all at t=0, then again at Poisson --rate arrivals;
  chat    --conversations conversations of --turns turns, each turn's prompt the whole
          conversation so far (earlier prompts and answers) plus 16-48 new tokens;
  mixed   --mixed requests of `bench compare`'s mixed workload (no sharing).
Reports TTFT p50/p99 and output tokens/s per workload and setting, the ratio on/off, the
prefix hit rate the engine counted, and TTFT per chat turn.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl

SETTINGS = {"on": [], "off": ["--no-prefix-cache"]}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench prefix", description=__doc__.split("\n")[0],
                                epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smol",
                   help="the model to serve (tiny | smol | null | smollm2 | PATH)")
    p.add_argument("--requests", type=int, default=64, help="requests sharing one system prompt")
    p.add_argument("--system-len", type=int, default=448,
                   help="tokens of the shared system prompt")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens of each request")
    p.add_argument("--rate", type=float, default=4.0, help="arrivals/s of the steady pass")
    p.add_argument("--conversations", type=int, default=16,
                   help="chat conversations run in parallel")
    p.add_argument("--turns", type=int, default=4, help="turns of each conversation")
    p.add_argument("--mixed", type=int, default=32, help="requests of the no-sharing workload")
    p.add_argument("--seed", type=int, default=0, help="the workload's random seed")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


def shared_workload(a, tokens: tuple[int, int]) -> list[bl.Req]:
    rng = random.Random(a.seed)
    system = [rng.randrange(*tokens) for _ in range(a.system_len)]
    return [bl.Req(system + [rng.randrange(*tokens) for _ in range(rng.randint(16, 64))],
                   a.output_len) for _ in range(a.requests)]


async def chat(address: str, a, tokens: tuple[int, int]) -> dict:
    """Conversations in parallel, turns in order: TTFT per turn and the hit rate."""
    from frontend.client import AsyncClient
    rng = random.Random(a.seed + 1)
    ttft = [[] for _ in range(a.turns)]

    async def conversation(c, k: int) -> None:
        history: list[int] = []
        for turn in range(a.turns):
            history += [rng.randrange(*tokens) for _ in range(rng.randint(16, 48))]
            t0 = asyncio.get_running_loop().time()
            first, out = None, []
            async for d in c.stream(list(history), max_tokens=a.output_len, ignore_eos=True):
                if d.token_ids and first is None:
                    first = asyncio.get_running_loop().time() - t0
                out += d.token_ids
            ttft[turn].append(first * 1e3)
            history += out

    async with AsyncClient(address, timeout=a.timeout) as c:
        before = await c.stats()
        await asyncio.gather(*(conversation(c, k) for k in range(a.conversations)))
        after = await c.stats()
    return {"ttft_ms_per_turn": [bl.summarize(t) for t in ttft], **hit_rate(before, after)}


def hit_rate(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0) - before.get(k, 0)
         for k in ("prefix_query_tokens", "prefix_hit_tokens", "prefix_recompute_hit_tokens")}
    q = d["prefix_query_tokens"]
    return {**d, "hit_rate": d["prefix_hit_tokens"] / q if q else 0.0}


def drive(address: str, a, reqs: list[bl.Req], label: str) -> dict:
    run = asyncio.run(bl.drive(address, reqs, timeout=a.timeout, progress=a.progress,
                               label=label, ignore_eos=True))
    doc = bl.metrics(run)
    doc.update(hit_rate(run.stats_before, run.stats_after))
    return doc


def one_setting(a, serve_args: list[str], flags: list[str], tokens) -> dict:
    from scripts.group.harness import start_group
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-prefix-"))
    group = start_group(tmp, ["--model", a.model, *serve_args, *flags], log=False)
    try:
        shared = shared_workload(a, tokens)
        steady = [bl.Req(r.prompt, r.max_tokens) for r in shared]
        bl.poisson_arrivals(steady, a.rate, a.seed)
        out = {"shared_t0": drive(group.address, a, shared, "shared t=0"),
               "shared_steady": drive(group.address, a, steady, "shared steady")}
        out["chat"] = asyncio.run(chat(group.address, a, tokens))
        out["mixed"] = drive(group.address, a, bl.mixed_workload(a.mixed, tokens), "mixed")
        return out
    finally:
        group.stop()


def ratios(on: dict, off: dict) -> dict:
    out = {}
    for w in ("shared_t0", "shared_steady", "mixed"):
        out[w] = {"ttft_p50_off_over_on": off[w]["ttft_ms"]["p50"] / on[w]["ttft_ms"]["p50"],
                  "throughput_on_over_off": on[w]["output_tok_s"] / off[w]["output_tok_s"]}
    return out


def report(doc: dict) -> str:
    rows = []
    for w in ("shared_t0", "shared_steady", "mixed"):
        for s in ("on", "off"):
            m = doc[s][w]
            rows.append((w, s, bl._ms(m["ttft_ms"]["p50"]), bl._ms(m["ttft_ms"]["p99"]),
                         f"{m['output_tok_s']:.1f}", f"{m['hit_rate']:.2f}"))
    lines = [bl.table(rows, ("workload", "cache", "TTFT p50", "TTFT p99", "out tok/s", "hit rate"))]
    for w, r in doc["ratios"].items():
        lines.append(f"{w}: TTFT p50 off/on {r['ttft_p50_off_over_on']:.2f}x, "
                     f"throughput on/off {r['throughput_on_over_off']:.2f}x")
    for s in ("on", "off"):
        c = doc[s]["chat"]
        turns = ", ".join(bl._ms(t["p50"]) for t in c["ttft_ms_per_turn"])
        lines.append(f"chat, cache {s}: hit rate {c['hit_rate']:.2f}; TTFT p50 per turn {turns}")
    return "\n".join(lines)


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    start = prov.begin("prefix", a.json, a.allow_dirty)
    facts = bl.model_facts(a.model)
    tokens = bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])
    doc = {"model": a.model, "serve_args": serve_args, "machine": bl.machine(),
           "workload": {k: getattr(a, k) for k in ("requests", "system_len", "output_len", "rate",
                                                   "conversations", "turns", "mixed", "seed")}}
    for name, flags in SETTINGS.items():
        print(f"cache {name}: starting a group on {a.model} ...", file=sys.stderr, flush=True)
        doc[name] = one_setting(a, serve_args, flags, tokens)
    doc["ratios"] = ratios(doc["on"], doc["off"])
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    errors = sum(doc[s][w]["errors"] for s in SETTINGS for w in ("shared_t0", "shared_steady", "mixed"))
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
