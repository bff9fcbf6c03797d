"""scripts/bench structured's compile times, measured in this process on the model's
tokenizer with the worker's own code (worker/grammar.py `Grammars.build`, llguidance), for
each schema as the engine receives it (the frontend's compact text, frontend/structured.py):

  cold    the first request of a new schema: its grammar built, then the copy its sequence
          gets (Grammars.build + deep_copy);
  cached  a request whose schema the worker already holds: the copy alone;
  first mask, cold / cached: the first token mask of the first sequence of a schema
          (llguidance builds its lexer lazily: this is where it does) / of a second one.

The tokenizer's set-up (once per worker, seconds) is timed apart and before any schema."""
from __future__ import annotations

import time

from scripts.benchmarks import common as bl


def _ms(fn):
    t = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t) * 1e3


def compile_times(model: str, schemas: list[dict]) -> dict:
    from core.ipc.protocol import Constraint
    from frontend.structured import constraint_of
    from worker.grammar import Grammars
    from worker.load import resolve_checkpoint
    facts = bl.model_facts(model)
    g = Grammars(str(resolve_checkpoint(model)[0]), facts["vocab_size"], facts["eos_ids"])
    _, setup = _ms(lambda: g.build(Constraint("json", '{"type": "object"}')))
    cold, cached, mask_cold, mask_cached = [], [], [], []
    for s in schemas:
        c = constraint_of(None, {"json": s})
        built, build_ms = _ms(lambda: g.build(c))
        first, copy_ms = _ms(built.deep_copy)
        cold.append(build_ms + copy_ms)
        mask_cold.append(_ms(first.compute_bitmask)[1])
        second, copy_ms = _ms(built.deep_copy)
        cached.append(copy_ms)
        mask_cached.append(_ms(second.compute_bitmask)[1])
        if first.is_error():
            raise RuntimeError(f"schema {s} does not compile: {first.get_error()}")
    return {"schemas": len(schemas), "tokenizer_setup_ms": setup,
            "cold_ms": bl.summarize(cold), "cached_ms": bl.summarize(cached),
            "first_mask_cold_ms": bl.summarize(mask_cold),
            "first_mask_cached_ms": bl.summarize(mask_cached)}
