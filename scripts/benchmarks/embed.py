#!/usr/bin/env python
"""Embedding throughput beside generation's on one group: the same seeded prompts embedded,
prefilled (max_tokens 1) and generated, the three turns alternating within one run.

    scripts/bench embed --model smollm2 --requests 64 --prompt-len 64-256 --json out.json

An embedding is a prefill-only request (docs/design/worker.md, "Embeddings"), so its input
tokens/s is set beside two generation figures on the same prompts: prompt tokens/s of
requests that sample one token (the same prefill work, plus a sample and a detokenized
delta) and output tokens/s of requests that generate --output-len tokens. Every request of a
turn is sent at once (one AsyncClient). The turns' prompts have the same lengths, but each
turn draws its own token ids, so that no turn finds another's prompts in the prefix cache.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

from core import cli
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from scripts.benchmarks.serve import model_of, token_range

TURNS = ("embed", "prefill", "generate")


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench embed", description=__doc__.split("\n")[0],
                   epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smollm2", help="the group's model (default: smollm2)")
    p.add_argument("--requests", "-n", type=int, default=64, help="prompts a turn")
    p.add_argument("--prompt-len", default="64-256", help="LO-HI tokens, uniform")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens of the generate turn")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the three turns")
    p.add_argument("--seed", type=int, default=0, help="the prompts' random seed")
    prov.add_client_run_options(p)
    a, serve_args = p.parse_known_args(argv)
    if a.requests < 1 or a.rounds < 1 or a.output_len < 2:
        p.error("--requests and --rounds must be >= 1, --output-len >= 2")
    return a, serve_args


async def embed_turn(address: str, prompts: list[list[int]], timeout: float) -> dict:
    from frontend.client import AsyncClient
    async with AsyncClient(address, timeout=timeout) as c:
        t0 = time.perf_counter()
        vectors = await c.embed(prompts)
        wall = time.perf_counter() - t0
    if len(vectors) != len(prompts) or not all(vectors):
        raise SystemExit(f"bench embed: {len(vectors)} vectors for {len(prompts)} prompts")
    tokens = sum(map(len, prompts))
    return {"wall_s": wall, "input_tokens": tokens, "input_tok_s": tokens / wall,
            "requests_s": len(prompts) / wall, "errors": 0}


def generate_turn(address: str, prompts: list[list[int]], max_tokens: int, a) -> dict:
    reqs = [bl.Req(list(p), max_tokens) for p in prompts]
    run = asyncio.run(bl.drive(address, reqs, timeout=a.timeout, progress=a.progress,
                               label=f"max_tokens {max_tokens}", ignore_eos=True))
    m = bl.metrics(run)
    tokens = sum(map(len, prompts))
    return {"wall_s": m["wall_s"], "input_tokens": tokens, "input_tok_s": tokens / m["wall_s"],
            "output_tokens": m["output_tokens"], "output_tok_s": m["output_tok_s"],
            "requests_s": m["requests_s"], "errors": m["errors"]}


def prompts_of(lengths: list[int], tokens: tuple[int, int], seed: str) -> list[list[int]]:
    """Prompts of these lengths, ids uniform in [lo, hi), drawn from `seed`."""
    rng = random.Random(seed)
    return [[rng.randrange(*tokens) for _ in range(n)] for n in lengths]


def run(a, address: str) -> dict:
    stats = asyncio.run(model_of(address, a.timeout))
    tokens = token_range(argparse.Namespace(vocab=None), stats.get("model") or a.model)
    lo, hi = bl.parse_range(a.prompt_len)
    lengths = [random.Random(f"{a.seed}-{i}").randint(lo, hi) for i in range(a.requests)]
    rounds = []
    for i in range(a.rounds):
        print(f"round {i + 1}/{a.rounds} ...", file=sys.stderr, flush=True)
        p = [prompts_of(lengths, tokens, f"{a.seed}-{i}-{t}") for t in TURNS]
        rounds.append({"embed": asyncio.run(embed_turn(address, p[0], a.timeout)),
                       "prefill": generate_turn(address, p[1], 1, a),
                       "generate": generate_turn(address, p[2], a.output_len, a)})
    best = {t: max((r[t] for r in rounds), key=lambda x: x["input_tok_s"]) for t in TURNS}
    return {"rounds": rounds, "best": best, "model": stats.get("model"),
            "workload": {"requests": a.requests, "prompt_len": a.prompt_len,
                         "prompt_tokens": sum(lengths), "output_len": a.output_len,
                         "seed": a.seed, "token_range": list(tokens)}}


def report(doc: dict) -> str:
    b = doc["best"]
    rows = [("embed", f"{b['embed']['input_tok_s']:.0f}", "-", f"{b['embed']['requests_s']:.2f}"),
            ("prefill (max_tokens 1)", f"{b['prefill']['input_tok_s']:.0f}", "-",
             f"{b['prefill']['requests_s']:.2f}"),
            (f"generate (max_tokens {doc['workload']['output_len']})",
             f"{b['generate']['input_tok_s']:.0f}", f"{b['generate']['output_tok_s']:.1f}",
             f"{b['generate']['requests_s']:.2f}")]
    return bl.table(rows, ("turn (best of the rounds)", "prompt tok/s", "output tok/s",
                           "requests/s"))


def main(argv=None) -> int:
    a, serve_args = parse(argv)
    start = prov.begin("embed", a.json, a.allow_dirty)
    from scripts.group.harness import start_group
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-embed-"))
    print(f"starting a group on {a.model} ...", file=sys.stderr, flush=True)
    group = start_group(tmp, ["--model", a.model, *serve_args], log=False)
    try:
        doc = run(a, group.address)
    finally:
        group.stop()
    doc["serve_args"], doc["machine"] = serve_args, bl.machine()
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    errors = sum(r[t]["errors"] for r in doc["rounds"] for t in TURNS)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
