#!/usr/bin/env python
"""Model quality: the perplexity of a GGUF model over a fixed English text, computed by the
engine (prompt logprobs over HTTP), by stock transformers on the same dequantized weights
and by llama.cpp's llama-perplexity on the GGUF itself, over the same tokens and windows;
and greedy agreement with llama-server on 64 chat prompts (docs/design/benchmarks.md, "Quality").

    scripts/bench quality [--json FILE] [--model smollm2] [--ctx 512] [--allow-dirty]
        [--engine-args=--prefill-bf16]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core import cli
from scripts import ROOT
from scripts.benchmarks import _quality_ppl as qp
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl

DATA = Path(__file__).parent / "data"
TEXT = DATA / "quality_text.txt"
PROMPTS = DATA / "chat_prompts.json"
GREEDY_TOKENS = 32
GOALS = {"transformers": 0.001, "llamacpp": 0.01}   # relative to the engine's perplexity


def text_of(path: Path) -> str:
    """The text scored: the file less one trailing newline (llama-perplexity drops it)."""
    return path.read_text().removesuffix("\n")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def gguf_model(model: str) -> tuple[Path, Path]:
    """(the GGUF file, the float32 checkpoint directory the engine serves it from)."""
    from worker.load import resolve_checkpoint
    ckpt, facts = resolve_checkpoint(model)
    if facts.get("format") != "gguf":
        raise SystemExit(f"quality: {model!r} is not a GGUF model (llama.cpp scores the GGUF "
                         "file itself): use smollm2 or a .gguf file")
    return Path(facts["path"]), ckpt


def chat_prompts(ckpt: Path) -> list[list[int]]:
    """The committed questions as token ids: the model's chat template (as the gateway
    renders it), then tokenized without special tokens, as the gateway does."""
    return rendered_chats(ckpt, json.loads(PROMPTS.read_text()))


def rendered_chats(ckpt: Path, questions: list[str]) -> list[list[int]]:
    """Each question as a one-message chat's token ids, as the gateway sends it."""
    from frontend.http.chat import ChatTemplate
    tmpl = ChatTemplate.load(str(ckpt))
    return [tmpl.tokenizer(tmpl.render([{"role": "user", "content": q}]),
                           add_special_tokens=False)["input_ids"] for q in questions]


def run_engine(model: str, tmp: Path, wins, ctx: int, prompts, eog,
               engine_args: str = "") -> tuple[list, list]:
    from scripts.benchmarks import _quality_engine as eng
    from scripts.group.harness import start_group
    group = start_group(tmp, ["--model", model, "--http-port", "0", *shlex.split(engine_args)],
                        log=False, timeout=600)
    try:
        scores = eng.score(group.http, wins, ctx)
        gen = eng.greedy(group.address, prompts, GREEDY_TOKENS, eog) if prompts else []
    finally:
        group.stop()
    return scores, gen


def parse(argv=None) -> argparse.Namespace:
    ap = cli.parser(prog="scripts/bench quality", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a GGUF model: smollm2 or FILE.gguf")
    ap.add_argument("--ctx", type=int, default=512, help="window size in tokens (default 512, "
                    "llama-perplexity's)")
    ap.add_argument("--json", default=None, help="write the figures here")
    prov.add_allow_dirty(ap)
    ap.add_argument("--engine-args", default="",
                    help="more scripts/serve flags for the engine, e.g. --engine-args=--prefill-bf16")
    ap.add_argument("--no-llamacpp", action="store_true",
                    help="skip llama.cpp (its figures are null)")
    ap.add_argument("--llamacpp-threads", type=int, default=None,
                    help="llama.cpp's threads (default: the usable cores; on a loaded machine "
                    "fewer spin less at its barriers)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    start = prov.begin("quality", a.json, a.allow_dirty)
    doc = {"model": a.model, "engine_args": a.engine_args, "uptime_before": uptime(),
           "machine": bl.machine()}
    from worker.gguf_file import hash_file
    gguf, ckpt = gguf_model(a.model)
    doc.update(model_file=gguf.name, model_sha256=hash_file(gguf))
    tokens = text_tokens(ckpt)
    wins = qp.windows(tokens, a.ctx)
    if len(wins) < 2:
        raise SystemExit(f"quality: {len(tokens)} tokens make fewer than 2 windows of {a.ctx}")
    doc["text"] = {"file": str(TEXT.relative_to(ROOT)), "tokens": len(tokens)}
    doc["windows"] = {"ctx": a.ctx, "count": len(wins), "scored_from": a.ctx // 2 + 1,
                      "scored_per_window": len(qp.scored_positions(a.ctx))}
    with tempfile.TemporaryDirectory(prefix="tl-quality-") as tmp:
        doc.update(measure(a, Path(tmp), gguf, ckpt, wins))
    doc.update(verdicts(doc), uptime_after=uptime())
    report(doc)
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    return 0


def text_tokens(ckpt: Path) -> list[int]:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(ckpt)(text_of(TEXT),
                                               add_special_tokens=False)["input_ids"]


def measure(a, tmp: Path, gguf: Path, ckpt: Path, wins: list[list[int]]) -> dict:
    """The three scorers in turn, each with the machine to itself, and greedy agreement."""
    from scripts.benchmarks import _quality_hf as hf
    prompts = chat_prompts(ckpt)
    eog = None if a.no_llamacpp else _eog(gguf)
    seconds = {}
    t0 = time.monotonic()
    engine, gen = run_engine(a.model, tmp, wins, a.ctx, [] if eog is None else prompts,
                             eog or [], a.engine_args)
    seconds["engine"] = time.monotonic() - t0
    t0 = time.monotonic()
    from worker.load import float_checkpoint, resolve_checkpoint
    ref = hf.score(float_checkpoint(*resolve_checkpoint(a.model)), wins, a.ctx)
    seconds["transformers"] = time.monotonic() - t0
    ppl = qp.perplexity(engine)
    out = {"tokens": ppl.tokens, "ppl_engine": ppl.ppl,
           "ppl_transformers": qp.perplexity(ref).ppl, "ppl_llamacpp": None, "greedy": None,
           "seconds": seconds}
    if eog is not None:
        _llamacpp(out, gguf, wins, a.ctx, prompts, gen, eog, tmp, seconds, a.llamacpp_threads)
    return out


def verdicts(doc: dict) -> dict:
    vs_t = qp.relative_diff(doc["ppl_engine"], doc["ppl_transformers"])
    vs_l = qp.relative_diff(doc["ppl_llamacpp"], doc["ppl_engine"])
    return {"engine_vs_transformers": vs_t, "llamacpp_vs_engine": vs_l,
            "goals": {"transformers_within_0.1pct": vs_t <= GOALS["transformers"],
                      "llamacpp_within_1pct": None if vs_l is None
                      else vs_l <= GOALS["llamacpp"]}}


def _eog(gguf: Path) -> list[int]:
    from scripts.benchmarks import _quality_llamacpp as lc
    return lc.eog_ids(gguf)


def _llamacpp(doc, gguf, wins, ctx, prompts, gen, eog, tmp, seconds, threads) -> None:
    from scripts.benchmarks import _llamacpp_serve as serve
    from scripts.benchmarks import _quality_llamacpp as lc
    threads = threads or serve.threads()
    t0 = time.monotonic()
    ppl = lc.perplexity(gguf, TEXT, ctx, wins, tmp, threads)
    peer = lc.greedy(gguf, prompts, GREEDY_TOKENS, tmp, threads)
    seconds["llamacpp"] = time.monotonic() - t0
    doc["ppl_llamacpp"] = ppl.pop("ppl")
    doc["llamacpp"] = {**ppl, "threads": threads}
    doc["greedy"] = qp.agreement(gen, peer, frozenset(eog), GREEDY_TOKENS)
    doc["greedy"]["eog_ids"] = eog


def report(doc: dict) -> None:
    pct = lambda v: "-" if v is None else f"{100 * v:.3g}%"  # noqa: E731
    num = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    w = doc["windows"]
    print(f"quality: {doc['model']} ({doc['model_file']}), {doc['tokens']} tokens scored in "
          f"{w['count']} windows of {w['ctx']}"
          + (f"; engine flags {doc['engine_args']}" if doc.get("engine_args") else ""))
    print(bl.table([("engine", num(doc["ppl_engine"]), ""),
                    ("transformers", num(doc["ppl_transformers"]),
                     pct(doc["engine_vs_transformers"])),
                    ("llama.cpp", num(doc["ppl_llamacpp"]), pct(doc["llamacpp_vs_engine"]))],
                   ("scorer", "perplexity", "diff vs engine")))
    if doc.get("greedy"):
        g = doc["greedy"]
        print(f"greedy agreement with llama-server: {g['identical']}/{g['requests']} requests "
              f"identical over the first {g['first_tokens']} tokens; the engine's top-2 "
              f"margin where they part: median {num(g['margin_median'])}, largest "
              f"{num(g['margin_max'])}")
    print(f"load: before [{doc['uptime_before']}] after [{doc['uptime_after']}]")


if __name__ == "__main__":
    sys.exit(main())
