"""xgrammar against llguidance on one model's tokenizer (docs/structured.md, "Choosing the
grammar engine"): each schema's cold compile, then the token masks of 64 rows stepped
together, both engines in the same run so that the machine's load falls on both.

    python -m scripts.benchmarks._grammar_engines [--model smollm2] [--rows 64] [--steps 32]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    from worker.load import resolve_checkpoint
    path = resolve_checkpoint(model)[0]
    tok = AutoTokenizer.from_pretrained(str(path))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return tok, vocab


class _XGrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab: int, threads: int):
        import xgrammar as xgr
        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab,
                                                  stop_token_ids=[tok.eos_token_id])
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads)
        self.vocab = vocab

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema, any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def masks(self, matchers, bitmask) -> None:
        live = [i for i, m in enumerate(matchers) if not m.is_terminated()]
        self.batch.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask, live)

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)

    def done(self, m) -> bool:
        return m.is_terminated()


class _LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab: int, threads: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch   # imports torch.compile's machinery (seconds): not timed
        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self.vocab = vocab

    def compile(self, schema: str):
        g = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
        m = self.ll.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return g

    def matcher(self, compiled):
        return self.ll.LLMatcher(self.tok, compiled, log_level=0)

    def masks(self, matchers, bitmask) -> None:
        self.ll.torch.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers) if not m.is_stopped()],
            bitmask)

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)

    def done(self, m) -> bool:
        return m.is_stopped()


def _allowed(bitmask: torch.Tensor, row: int, vocab: int) -> list[int]:
    bits = bitmask[row].view(torch.uint8).numpy()
    import numpy as np
    return np.nonzero(np.unpackbits(bits, bitorder="little")[:vocab])[0].tolist()


def measure(engine, schemas: list[str], rows: int, steps: int, seed: int) -> dict:
    t = time.perf_counter()
    engine.compile('{"type": "object"}')          # first use: lazy set-up excluded
    warm_ms = (time.perf_counter() - t) * 1e3
    compiled, compile_ms = [], []
    for s in schemas:
        t = time.perf_counter()
        compiled.append(engine.compile(s))
        compile_ms.append((time.perf_counter() - t) * 1e3)
    matchers = [engine.matcher(compiled[i % len(compiled)]) for i in range(rows)]
    bitmask = torch.zeros((rows, (engine.vocab + 31) // 32), dtype=torch.int32)
    rng = random.Random(seed)
    mask_ms = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.masks(matchers, bitmask)
        mask_ms.append((time.perf_counter() - t) * 1e3)
        for i, m in enumerate(matchers):
            if not engine.done(m):
                engine.accept(m, rng.choice(_allowed(bitmask, i, engine.vocab)))
    return {"first_use_ms": warm_ms, "compile_ms_p50": statistics.median(compile_ms),
            "compile_ms_max": max(compile_ms), "compile_ms_sum": sum(compile_ms),
            "mask_ms_per_step_p50": statistics.median(mask_ms),
            "mask_ms_per_step_first": mask_ms[0],
            "mask_ms_per_step_late_p50": statistics.median(mask_ms[len(mask_ms) // 2:]),
            "mask_us_per_row": statistics.median(mask_ms) * 1e3 / rows}


def main(argv=None) -> int:
    from scripts.benchmarks._schemas import schemas
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--schemas", type=int, default=10)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    a = p.parse_args(argv)
    tok, vocab = _tokenizer(a.model)
    texts = [json.dumps(s) for s in schemas(a.schemas)]
    print(f"load: {os.getloadavg()}  cpus: {os.cpu_count()}  vocab: {vocab}")
    out = {}
    for cls in (_XGrammar, _LLGuidance):
        t = time.perf_counter()
        engine = cls(tok, vocab, a.threads)
        setup = (time.perf_counter() - t) * 1e3
        out[cls.name] = {"tokenizer_setup_ms": setup, **measure(engine, texts, a.rows,
                                                                 a.steps, 0)}
    keys = list(out["xgrammar"])
    print(f"{'':24}{'xgrammar':>12}{'llguidance':>12}{'xgr/llg':>9}")
    for k in keys:
        x, g = out["xgrammar"][k], out["llguidance"][k]
        print(f"{k:24}{x:12.2f}{g:12.2f}{x / g if g else float('nan'):9.2f}")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
