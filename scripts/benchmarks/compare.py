#!/usr/bin/env python
"""tl-engine against plain transformers on one machine, one model, one workload.

    scripts/bench compare --model smol --requests 256 --json compare.json
    scripts/bench compare --quick                     # 32 requests
    scripts/bench compare --peer llamacpp             # vs llama-server, mixed-64 at 1,8,64
    scripts/bench compare --peer llamacpp --gguf FILE [--gguf-type Q8_0]   # on its blocks

The workload "mixed" (common.MIXED): random.Random(0), prompt length uniform 16-512,
output length uniform 16-256, random token ids away from EOS, greedy, EOS ignored, every
request at t=0. It is cut into --rounds consecutive slices; each round runs every system on
its slice, one after another, who goes first rotating round by round (_compare_shared.turns),
so that the machine's drift in speed lands on all of them alike. The systems:
  1. tl-engine: the whole process group (scripts/serve, fp32) through AsyncClient, started
     once, the slice sent at once; its prefix-cache hits are recorded (the prompts share no
     prefix, the warm-up's none either);
  2. transformers `generate`, one request at a time, on the first requests of each slice
     (--sequential in all), its tokens/s extrapolated to the whole;
  3. transformers `generate` on left-padded static batches of --batch requests within each
     slice: each batch runs to its longest max_new_tokens, only each request's own tokens
     count;
  4. transformers' continuous batching (init_continuous_batching + add_request, page_size
     32, num_blocks sized to the workload, max_batch_tokens 512, sdpa), a manager set up and
     warmed before each round's clock starts.
Greedy agreement with the engine's tokens is reported per baseline (left padding changes
numerics slightly: reported, not required). A system that fails records its error in the
JSON and the others go on.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from core import cli
from scripts.benchmarks import _compare_phases as ph
from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from scripts.benchmarks._llamacpp_quantize import TYPES as GGUF_TYPES

PHASES = ("engine", "hf_sequential", "hf_static", "hf_cb")
LABELS = {"engine": "tl-engine (process group)", "hf_sequential": "HF generate, one at a time",
          "hf_static": "HF generate, static batches", "hf_cb": "HF continuous batching"}
CACHES = ("transformers: none across requests; tl-engine: prefix cache on, hits recorded "
          "(engine.prefix_hit_tokens), the prompts sharing no prefix")


def parse(argv=None) -> argparse.Namespace:
    p = cli.parser(prog="scripts/bench compare", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smol", help="the model both sides run (tiny | smol | PATH)")
    p.add_argument("--requests", type=int, default=None,
                   help="default 256; 64 with --peer (mixed-64)")
    p.add_argument("--quick", action="store_true", help="32 requests, 4 sequential")
    p.add_argument("--peer", choices=("llamacpp",),
                   help="instead of the transformers phases: llama.cpp's llama-server, side "
                        "by side at each --concurrency (built and cached on first use)")
    p.add_argument("--gguf", metavar="FILE",
                   help="with --peer: both systems serve this GGUF file as it is (the engine"
                        " on its quantized blocks); instead of --model")
    p.add_argument("--gguf-type", choices=[t for t in GGUF_TYPES if t != "F32"],
                   help="with --gguf: first re-quantize it with llama.cpp's llama-quantize")
    p.add_argument("--concurrency", default="1,8,64",
                   help="with --peer: comma-separated requests in flight")
    p.add_argument("--agree-first", type=int, default=16,
                   help="with --peer: greedy agreement over each request's first N tokens")
    p.add_argument("--rounds", type=int, default=2,
                   help="without --peer: slices of the workload the systems take turns over")
    p.add_argument("--sequential", type=int, default=8,
                   help="requests run one at a time, spread over the rounds")
    p.add_argument("--batch", type=int, default=32, help="static batch size")
    p.add_argument("--skip", default="",
                   help=f"comma-separated phases to skip: {','.join(PHASES)}")
    p.add_argument("--engine-args", default="",
                   help='extra scripts/serve flags, given with "=": --engine-args="--no-log"')
    p.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(p)
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")
    a = p.parse_args(argv)
    if a.quick:
        a.requests, a.sequential = 32, min(a.sequential, 4)
    if a.requests is None:
        a.requests = 64 if a.peer else 256
    try:
        a.concurrency = sorted({int(c) for c in a.concurrency.split(",") if c.strip()})
    except ValueError:
        p.error(f"--concurrency: want comma-separated integers, got {a.concurrency!r}")
    if not a.concurrency or a.concurrency[0] < 1:
        p.error("--concurrency: want at least one level, each >= 1")
    if a.requests < 1 or a.agree_first < 1 or a.rounds < 1:
        p.error("--requests, --agree-first and --rounds must be >= 1")
    if (a.gguf or a.gguf_type) and not a.peer:
        p.error("--gguf and --gguf-type go with --peer llamacpp")
    if a.gguf_type and not a.gguf:
        p.error("--gguf-type needs --gguf FILE")
    a.skip = {s for s in a.skip.split(",") if s}
    if a.skip - set(PHASES):
        p.error(f"unknown phase(s) in --skip: {', '.join(sorted(a.skip - set(PHASES)))}")
    return a


def open_phases(a, reqs, path: str, n_rounds: int) -> tuple[dict, dict]:
    """The systems ready to run rounds, and an error for each that could not start."""
    opened, errors = {}, {}
    wanted = [n for n in PHASES if n not in a.skip]
    if "engine" in wanted:
        _attempt("engine", lambda: ph.Engine(a, reqs), opened, errors)
    hf = [n for n in wanted if n != "engine"]
    if hf:
        try:
            model = ph.load_hf(path)
        except Exception as e:
            traceback.print_exc()
            return opened, {**errors, **{n: f"loading the HF model: {e}" for n in hf}}
        makers = {"hf_sequential": lambda: ph.Sequential(a, model, reqs, n_rounds),
                  "hf_static": lambda: ph.Static(a, model, reqs),
                  "hf_cb": lambda: ph.ContinuousBatching(a, model, reqs)}
        for n in hf:
            _attempt(n, makers[n], opened, errors)
    return opened, errors


def _attempt(name: str, fn, opened: dict, errors: dict) -> None:
    """opened[name] = fn(), or errors[name] = why not (reported, and the others go on)."""
    try:
        opened[name] = fn()
    except Exception as e:
        traceback.print_exc()
        errors[name] = f"{type(e).__name__}: {e}"


def run_all(a, reqs, path: str) -> tuple[dict, dict]:
    """Every system's figures ({"error"} for a failed one) and the rounds' plan."""
    parts = cs.split(reqs, a.rounds)
    opened, errors = open_phases(a, reqs, path, len(parts))
    plan = cs.turns([n for n in PHASES if n in opened], len(parts))
    try:
        for i, (part, order) in enumerate(zip(parts, plan)):
            cs.say(f"== round {i + 1}/{len(parts)}: {len(part)} requests, {', '.join(order)}")
            for n in order:
                if n in opened and n not in errors:
                    _attempt(n, lambda: opened[n].run(part, f"{LABELS[n]} r{i + 1}"), {}, errors)
    finally:
        for p in opened.values():
            p.close()
    res = {n: opened[n].result() for n in PHASES if n in opened and n not in errors}
    res.update({n: {"error": e, "outputs": None} for n, e in errors.items()})
    return res, {"count": len(parts), "slices": [len(p) for p in parts],
                 "order": [list(o) for o in plan], "caches": CACHES}


def summary(a, reqs, tokens, res: dict, plan: dict) -> dict:
    tok_s = {n: res.get(n, {}).get("tok_s") for n in PHASES}
    doc = {f"{n}_tok_s": tok_s[n] for n in PHASES}
    eng = tok_s["engine"]
    doc["ratios"] = {f"engine_over_{n}": (eng / tok_s[n] if eng and tok_s[n] else None)
                     for n in PHASES[1:]}
    eng_out = res.get("engine", {}).get("outputs")
    doc["agreement"] = {n: cs.agreement(eng_out, res[n]["outputs"])
                        for n in PHASES[1:] if eng_out and res.get(n, {}).get("outputs")}
    doc["phases"] = {n: {k: v for k, v in r.items() if k != "outputs"} for n, r in res.items()}
    doc["workload"] = {**bl.MIXED, **bl.describe(reqs), "token_range": list(tokens),
                       "sequential": res.get("hf_sequential", {}).get("requests_run"),
                       "static_batch": a.batch}
    doc["rounds"] = plan
    doc["model"] = a.model
    doc["dtype"] = "float32"
    doc["threads"] = _threads()
    doc["machine"] = bl.machine()
    return doc


def _threads() -> int | None:
    try:
        import torch
        return torch.get_num_threads()
    except ImportError:
        return None


def report(doc: dict) -> str:
    rows = []
    for n in PHASES:
        ph = doc["phases"].get(n)
        if ph is None:
            continue
        if "error" in ph:
            rows.append((LABELS[n], "error", "", "", ph["error"][:60]))
            continue
        ratio = doc["ratios"].get(f"engine_over_{n}")
        ag = doc["agreement"].get(n, {})
        eq = ag.get("equal_frac")
        rows.append((LABELS[n], f"{ph['tok_s']:.1f}", f"{ph['wall_s']:.1f}",
                     "1.00" if n == "engine" else (f"{ratio:.2f}" if ratio else "-"),
                     "-" if eq is None else f"{eq:.2f} of {ag['compared']}"))
    m, w, r = doc["machine"], doc["workload"], doc["rounds"]
    head = (f"  {doc['model']} fp32, workload mixed: {w['requests']} requests, "
            f"{w['max_output_tokens']} output tokens, in {r['count']} rounds of "
            f"{'/'.join(map(str, r['slices']))}; {m['cores']} cores, "
            f"{doc['threads']} torch threads")
    return head + "\n" + bl.table(rows, ("system", "tok/s", "wall s", "engine / it",
                                         "greedy agreement"))


def main(argv=None) -> int:
    a = parse(argv)
    if a.gguf:
        a.model = str(Path(a.gguf).expanduser().resolve())
        if a.gguf_type:
            from scripts.benchmarks._llamacpp_quantize import requantized
            a.model = str(requantized(Path(a.model), a.gguf_type))
    facts = bl.model_facts(a.model)
    tokens = bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])
    reqs = bl.mixed_workload(a.requests, tokens)
    start = prov.begin("compare", a.json, a.allow_dirty)
    if a.peer:
        from scripts.benchmarks import _compare_peer
        return _compare_peer.main(a, reqs, tokens, facts, start)
    res, plan = run_all(a, reqs, facts["path"])
    doc = summary(a, reqs, tokens, res, plan)
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    return 0 if all("error" not in r for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
