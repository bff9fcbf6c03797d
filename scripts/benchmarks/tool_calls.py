#!/usr/bin/env python
"""Tool calls on the trained model: the share of replies ending in usable calls, per tool_choice.

The share that ends `tool_calls` with usable calls, for tool_choice auto, required and
named (docs/structured.md, "Tool calls").

    scripts/bench tool_calls --json docs/bench/tool-calls.json
    scripts/bench tool_calls --prompts 4 --modes required        # a smoke run
    scripts/bench tool_calls --http http://127.0.0.1:8000        # a gateway already serving

A group serves --model with its HTTP gateway (or --http names one); each of --prompts tool
prompts (scripts/benchmarks/_tool_prompts.py: eight functions, eight questions each, three
functions offered per prompt) is sent once per mode to /v1/chat/completions, greedy,
parallel_tool_calls left at its default (on), --concurrency at a time. A reply is ok when
it ends `finish_reason: "tool_calls"` and every call names an offered function with
arguments that parse and are valid under its schema (jsonschema, the schema as sent).
Reported per mode: ok_share (the figure; goal: 1.0 for required and named), usable_share,
tool_calls_finish_share, right_tool_share (a call names the function the question asks
for), leaked (replies with `<tool_call>` text in content: must be 0), calls_per_reply,
finish_reasons, and up to --examples failing replies. Unknown flags go to scripts/serve.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from core import cli
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from scripts.benchmarks._tool_prompts import MODES, Case, body, cases, score, summarize

GOAL_MODES = ("required", "named")   # every reply must be ok


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench tool_calls", description=__doc__.split("\n")[0],
                   epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smollm2", help="the model the group serves")
    p.add_argument("--prompts", type=int, default=64, help="tool prompts per mode")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated tool_choice "
                   "modes: auto, required, named")
    p.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each request")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--http", metavar="URL", help="a gateway already serving (no group)")
    p.add_argument("--examples", type=int, default=3, help="failing replies kept per mode")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


def post(url: str, payload: dict, timeout: float) -> tuple[int, object]:
    req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]


def run_mode(url: str, mode: str, prompts: list[Case], a) -> dict:
    """Every prompt under `mode`: the summary, plus failing replies as examples."""
    def one(case: Case) -> tuple[dict, object]:
        status, reply = post(url, body(case, mode, a.max_tokens), a.timeout)
        return score(case, status, reply), reply
    with ThreadPoolExecutor(max(1, a.concurrency)) as pool:
        done = list(pool.map(one, prompts))
    out = summarize([m for m, _ in done])
    out["examples"] = [{"question": c.question, "tool": c.tool, "marks": m,
                        "message": r["choices"][0]["message"] if isinstance(r, dict) else r}
                       for c, (m, r) in zip(prompts, done) if not m["ok"]][:a.examples]
    return out


def report(doc: dict) -> str:
    rows = [(mode, r["requests"], _pct(r["ok_share"]), _pct(r["usable_share"]),
             _pct(r["tool_calls_finish_share"]), _pct(r["right_tool_share"]), r["leaked"],
             f"{r['calls_per_reply']:.2f}", json.dumps(r["finish_reasons"]))
            for mode, r in doc["results"].items()]
    return bl.table(rows, ("tool_choice", "replies", "ok", "usable", "ends tool_calls",
                           "right tool", "leaked", "calls/reply", "finish reasons"))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def measure(url: str, modes: list[str], a) -> dict:
    prompts = cases(a.prompts)
    post(url, body(prompts[0], "auto", 8), a.timeout)   # the first request is not a figure
    results = {}
    for mode in modes:
        print(f"tool_choice {mode}: {len(prompts)} prompts ...", file=sys.stderr, flush=True)
        results[mode] = run_mode(url, mode, prompts, a)
    return results


def main(argv=None) -> int:
    from scripts.group.harness import start_group
    a, serve_args = parse(argv)
    modes = a.modes.split(",")
    if set(modes) - set(MODES) or not 1 <= a.prompts:
        raise SystemExit(f"tool_calls: --modes takes {', '.join(MODES)}; --prompts >= 1")
    start = prov.begin("tool_calls", a.json, a.allow_dirty)
    group = None
    try:
        if a.http is None:
            tmp = Path(tempfile.mkdtemp(prefix="tl-bench-tool-calls-"))
            group = start_group(tmp, ["--model", a.model, "--http-port", "0", *serve_args],
                                log=False, timeout=600)
        results = measure(a.http or group.http, modes, a)
    finally:
        if group is not None:
            group.stop()
    doc = {"model": a.model, "serve_args": serve_args, "machine": bl.machine(),
           "workload": {"prompts": a.prompts, "modes": modes, "max_tokens": a.max_tokens,
                        "concurrency": a.concurrency, "greedy": True,
                        "parallel_tool_calls": "default (on)", "http": a.http},
           "goal_met": all(results[m]["ok_share"] == 1.0 for m in GOAL_MODES if m in results),
           "results": results}
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, None if a.http else a.model))
    return 1 if any(r["errors"] or r["leaked"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
