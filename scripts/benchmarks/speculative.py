#!/usr/bin/env python
"""Speculative decoding on and off, side by side on the trained model (docs/design/scheduler.md,
"Speculative decoding").

    scripts/bench speculative --json docs/bench/speculative-smollm2.json
    scripts/bench speculative --requests 2 --max-tokens 16 --levels 1 --turns 1   # a smoke run

    scripts/bench speculative --speculative draft:smollm2 --gguf-type F32 --workloads chat \
        --json docs/bench/speculative-draft-f32.json   # the Q4_1 file drafting for its F32 copy

Two groups serve the same model, one plain and one with `--speculative METHOD --num-draft K`,
both cold, both alive for the whole run; each (workload, level) is driven in --turns turns
that alternate which group goes first. Workloads, chat prompts rendered by the model's template:
copy-heavy (repeat a paragraph, or repeat it with one word changed) and plain chat questions.
Greedy, so the two groups' tokens must be equal: the run counts the requests that differ.
Reports per group: TPOT p50, output tokens/s, and for the speculative group the drafted and
accepted tokens, the acceptance rate and the tokens per decode step (1 + accepted drafts).
At 1 in flight llama-server on the same GGUF file takes its turns too, plain and with its own
prompt lookup (`--spec-type ngram-simple`) or the same draft model's file (`--spec-type
draft-simple`; scripts/benchmarks/_speculative_peer.py); `--no-llamacpp` leaves it out.
`--gguf-type T` first re-quantizes the model's GGUF file with llama.cpp's llama-quantize
(F32: its values dequantized) and both systems serve the file it writes. Levels above 1 run --wide-turns turns of --wide-max-tokens.
Unknown flags go to scripts/serve (both groups).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

from core import cli
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl

DATA = Path(__file__).parent / "data"
SETTINGS = ("off", "on")
PEERS = ("llamacpp-off", "llamacpp-on")
# a word swapped in the "light edit" prompts: (the paragraph's word, its replacement)
EDITS = (("the", "THE"), ("and", "plus"), ("of", "OF"))


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = cli.parser(prog="scripts/bench speculative", description=__doc__.split("\n")[0],
                   epilog="Unknown flags are passed to scripts/serve.")
    p.add_argument("--model", default="smollm2", help="the model both groups serve")
    p.add_argument("--speculative", default="ngram", metavar="METHOD",
                   help="the speculative group's method: 'ngram' or 'draft:MODEL' (a GGUF model)")
    p.add_argument("--gguf-type", choices=("Q8_0", "Q4_0", "Q4_1", "F32"),
                   help="serve the model's GGUF file re-quantized to this type by llama-quantize")
    p.add_argument("--workloads", default="copy,chat", help="comma-separated: copy, chat")
    p.add_argument("--num-draft", type=int, default=4, help="drafts per step at most (both)")
    p.add_argument("--levels", default="1,64", help="requests in flight, comma-separated")
    p.add_argument("--requests", type=int, default=8,
                   help="requests per workload at 1 in flight (a level L > 1 sends max(L, this))")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request at most")
    p.add_argument("--turns", type=int, default=2, help="turns per workload at 1 in flight")
    p.add_argument("--wide-turns", type=int, default=1, help="turns per workload above 1")
    p.add_argument("--wide-max-tokens", type=int, default=64,
                   help="tokens per request at most above 1 in flight")
    p.add_argument("--no-llamacpp", action="store_true", help="the engine alone")
    bl.add_run_options(p)
    return p.parse_known_args(argv)


def paragraphs() -> list[str]:
    text = (DATA / "quality_text.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if len(p.split()) >= 40]


def copy_questions(n: int) -> list[str]:
    paras = paragraphs()
    out = []
    for k in range(n):
        para = paras[k % len(paras)]
        if k % 2 == 0:
            out.append(f"Repeat the following paragraph exactly, word for word:\n\n{para}")
        else:
            old, new = EDITS[k // 2 % len(EDITS)]
            out.append(f"Repeat the following paragraph, replacing every '{old}' with "
                       f"'{new}' and changing nothing else:\n\n{para}")
    return out


def chat_questions(n: int) -> list[str]:
    qs = json.loads((DATA / "chat_prompts.json").read_text())
    return [qs[k % len(qs)] for k in range(n)]


def rendered(model: str, questions: list[str]) -> list[list[int]]:
    """Token ids as the gateway sends a chat: the template, then no special tokens added."""
    from scripts.benchmarks.quality import rendered_chats
    from worker.load import resolve_checkpoint
    return rendered_chats(resolve_checkpoint(model)[0], questions)


def turn(system, prompts: list[list[int]], level: int, max_tokens: int,
         a) -> tuple[dict, list]:
    """One system's run of the prompts: an engine group (its address) or a llama-server
    (a callable taking the requests)."""
    reqs = [bl.Req(p, max_tokens, options={"ignore_eos": False}) for p in prompts]
    if callable(system):
        run = system(reqs)
    else:
        run = asyncio.run(bl.drive(system, reqs, timeout=a.timeout, progress=False,
                                   concurrency=level, temperature=0.0))
    m = bl.metrics(run)
    b, e = run.stats_before, run.stats_after
    m["draft_tokens"] = e.get("draft_tokens", 0) - b.get("draft_tokens", 0)
    m["accepted_tokens"] = e.get("accepted_tokens", 0) - b.get("accepted_tokens", 0)
    return m, [t.tokens for t in run.traces]


def speculation(m: dict, n_requests: int) -> dict:
    """Acceptance and tokens per decode step (each request's first token comes from its
    prefill step; at 1 in flight every other step is one request's decode)."""
    decode_steps = m["steps"] - n_requests
    return {"acceptance": m["accepted_tokens"] / m["draft_tokens"] if m["draft_tokens"] else None,
            "tokens_per_decode_step": (m["output_tokens"] - n_requests) / decode_steps
            if decode_steps > 0 else None}


def measure(systems: dict, prompts: list[list[int]], level: int, a) -> dict:
    """Every system's turns, the order rotating turn by turn."""
    names = list(systems)
    turns, max_tokens = (a.turns, a.max_tokens) if level == 1 else (a.wide_turns,
                                                                      a.wide_max_tokens)
    runs: dict[str, list] = {n: [] for n in names}
    tokens: dict[str, list] = {}
    for t in range(turns):
        for n in names[t % len(names):] + names[:t % len(names)]:
            m, toks = turn(systems[n], prompts, level, max_tokens, a)
            runs[n].append(m)
            tokens.setdefault(n, toks)
    out = {n: pooled(runs[n], len(prompts), level) for n in names}
    out["differing_requests"] = sum(x != y for x, y in zip(tokens["off"], tokens["on"]))
    if "llamacpp-on" in out:
        out["llamacpp_differing_requests"] = sum(
            x != y for x, y in zip(tokens["llamacpp-off"], tokens["llamacpp-on"]))
        out["tpot_on_over_llamacpp_on"] = ratio(out["on"]["tpot_ms_p50"],
                                                out["llamacpp-on"]["tpot_ms_p50"])
        out["llamacpp_tpot_on_over_off"] = ratio(out["llamacpp-on"]["tpot_ms_p50"],
                                                 out["llamacpp-off"]["tpot_ms_p50"])
    off, on = out["off"], out["on"]
    out["tpot_on_over_off"] = ratio(on["tpot_ms_p50"], off["tpot_ms_p50"])
    out["tok_s_on_over_off"] = ratio(on["output_tok_s"], off["output_tok_s"])
    return out


def ratio(x, y) -> float | None:
    return x / y if x is not None and y else None


def pooled(ms: list[dict], n_requests: int, level: int) -> dict:
    """A setting's turns: the median of their TPOT p50s and tokens/s; drafts summed; the
    acceptance, and the tokens per decode step where a step is one request's (level 1)."""
    import statistics
    total = {k: sum(m[k] for m in ms) for k in ("draft_tokens", "accepted_tokens",
                                                "output_tokens", "steps", "errors")}
    spec = speculation(total, n_requests * len(ms))
    if level != 1:
        spec["tokens_per_decode_step"] = None
    return {"tpot_ms_p50": statistics.median(m["tpot_ms"]["p50"] or 0.0 for m in ms),
            "output_tok_s": statistics.median(m["output_tok_s"] for m in ms),
            "turns": [{"tpot_ms_p50": m["tpot_ms"]["p50"], "output_tok_s": m["output_tok_s"]}
                      for m in ms], **total, **spec}


def report(doc: dict) -> str:
    rows = []
    for key, r in doc["results"].items():
        for n in (*SETTINGS, *PEERS):
            if n not in r:
                continue
            s = r[n]
            rows.append((key, n, f"{s['tpot_ms_p50']:.1f}", f"{s['output_tok_s']:.1f}",
                         s["draft_tokens"], s["accepted_tokens"],
                         "-" if s["acceptance"] is None else f"{s['acceptance']:.2f}",
                         "-" if s["tokens_per_decode_step"] is None
                         else f"{s['tokens_per_decode_step']:.2f}"))
    lines = [bl.table(rows, ("workload@level", "spec", "TPOT p50 ms", "out tok/s", "drafted",
                             "accepted", "accept rate", "tok/decode step"))]
    for key, r in doc["results"].items():
        lines.append(f"{key}: TPOT on/off {r['tpot_on_over_off']:.3f}, tok/s on/off "
                     f"{r['tok_s_on_over_off']:.3f}, requests whose tokens differ: "
                     f"{r['differing_requests']}")
        if "llamacpp-on" in r:
            lines.append(f"{key}: TPOT on / llama.cpp on {r['tpot_on_over_llamacpp_on']:.3f}; "
                         f"llama.cpp TPOT on/off {r['llamacpp_tpot_on_over_off']:.3f}, "
                         f"its requests whose tokens differ: {r['llamacpp_differing_requests']}")
    return "\n".join(lines)


def spec_peer_args(a) -> list[str]:
    from scripts.benchmarks._speculative_peer import spec_args
    return spec_args(a.num_draft, draft_file(a))


def gguf_of(model: str) -> Path:
    from worker.load import resolve_checkpoint
    facts = resolve_checkpoint(model)[1]
    if facts.get("format") != "gguf":
        raise SystemExit(f"speculative: {model!r} is not a GGUF model; pass --no-llamacpp")
    return Path(facts["path"])


def draft_file(a) -> Path | None:
    """The draft model's GGUF file, with --speculative draft:MODEL."""
    from core.config import draft_of
    draft = draft_of(a.speculative)
    return None if draft is None else gguf_of(draft)


def llama_servers(a):
    """llama-server plain and drafting on the model's GGUF file (smollm2: the Q4_1 file)."""
    from scripts.benchmarks._speculative_peer import LlamaServers
    return LlamaServers(gguf_of(a.model), a.num_draft, ctx=2048, draft=draft_file(a))


def main(argv=None) -> int:
    from scripts.group.harness import start_group
    a, serve_args = parse(argv)
    start = prov.begin("speculative", a.json, a.allow_dirty)
    levels = [int(x) for x in a.levels.split(",")]
    workloads = {"copy": copy_questions, "chat": chat_questions}
    chosen = a.workloads.split(",")
    if set(chosen) - set(workloads):
        raise SystemExit(f"speculative: --workloads takes copy and chat, not {a.workloads!r}")
    tokenizer = a.model   # the re-quantized file's tokenizer is the source's
    if a.gguf_type:
        from scripts.benchmarks._llamacpp_quantize import requantized
        a.model = str(requantized(gguf_of(a.model), a.gguf_type))
    flags = {"off": [], "on": ["--speculative", a.speculative, "--num-draft", str(a.num_draft)]}
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-speculative-"))
    groups, peers = {}, None
    try:
        for n in SETTINGS:
            (tmp / n).mkdir()
            groups[n] = start_group(tmp / n, ["--model", a.model, *flags[n], *serve_args],
                                    log=False, timeout=600)
        if not a.no_llamacpp and 1 in levels:
            peers = llama_servers(a)
        results = {}
        for name in chosen:
            for level in levels:
                prompts = rendered(tokenizer, workloads[name](max(level, a.requests)))
                systems = {n: groups[n].address for n in SETTINGS}
                if peers is not None and level == 1:
                    systems.update({n: partial(peers.run, n) for n in PEERS})
                if not results:   # each system's first request is not a figure
                    for system in systems.values():
                        turn(system, prompts[:1], 1, 8, a)
                print(f"{name} at {level} in flight ...", file=sys.stderr, flush=True)
                results[f"{name}@{level}"] = measure(systems, prompts, level, a)
    finally:
        for g in groups.values():
            g.stop()
        if peers is not None:
            peers.stop()
    label = tokenizer + (f" as {a.gguf_type}" if a.gguf_type else "")
    doc = {"model": label, "serve_args": serve_args, "machine": bl.machine(),
           "workload": {"levels": levels, "requests": a.requests, "max_tokens": a.max_tokens,
                        "turns": a.turns, "wide_turns": a.wide_turns,
                        "wide_max_tokens": a.wide_max_tokens, "num_draft": a.num_draft,
                        "speculative": a.speculative, "gguf_type": a.gguf_type,
                        "greedy": True, "ignore_eos": False,
                        "llamacpp": None if peers is None else {
                            "spec_args": [Path(x).name if "/" in x else x
                                          for x in spec_peer_args(a)]}},
           "results": results}
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, label))
    bad = any(r["differing_requests"] or r["off"]["errors"] or r["on"]["errors"]
              for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
