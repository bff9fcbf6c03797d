#!/usr/bin/env python
"""Worker-only decode speed: the paged runner beside the stock transformers model with its
own DynamicCache, same model, batch and context. The caches are filled with random K/V
(the speed of a decode step does not depend on the values), so no prefill is timed or run.

    .venv/bin/python scripts/benchmarks/forward.py [--quick] [--json FILE] [--device cuda]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time


import torch

from core import cli
from worker.handmade import Part, blocks_needed, make_batch
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from worker.load import float_checkpoint, make_runner, resolve_checkpoint


def paged_steps(runner, batch_size: int, context: int, steps: int):
    """A function running decode step i of `batch_size` sequences at context + i."""
    bs = runner.info.block_size
    need = blocks_needed(context + steps, bs)
    ids = list(range(runner.info.num_blocks))
    random.Random(0).shuffle(ids)  # scattered blocks, as a long-running pool has them
    tables = [ids[i * need:(i + 1) * need] for i in range(batch_size)]
    runner.kv.normal_()
    vocab = runner.info.vocab_size
    toks = [[(7 * i + j) % vocab for j in range(context + steps)] for i in range(batch_size)]
    batches = [make_batch([Part(toks[i], context + s, 1, tables[i]) for i in range(batch_size)],
                          bs) for s in range(steps)]
    return lambda i: runner.execute(batches[i])


def stock_steps(model, batch_size: int, context: int):
    """The same with transformers' own DynamicCache (which grows by concatenation)."""
    from transformers import DynamicCache

    cfg = model.config
    kvh = cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dev, dtype = model.device, model.dtype
    cache = DynamicCache(config=cfg)
    with torch.inference_mode():
        for layer in range(cfg.num_hidden_layers):
            k = torch.randn(batch_size, kvh, context, hd, device=dev, dtype=dtype)
            cache.update(k, torch.randn_like(k), layer)
    ids = torch.randint(0, cfg.vocab_size, (batch_size, 1), device=dev)

    def one(i):
        pos = torch.full((batch_size, 1), context + i, device=dev)
        out = model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True,
                    logits_to_keep=1)
        return out.logits[:, -1].argmax(-1)
    return one


def interleaved_ms(fns, steps: int, warmup: int, sync=lambda: None) -> list[float]:
    """Median ms per step of each fn; steps alternate between them so that load from
    other processes hits all alike."""
    times = [[] for _ in fns]
    with torch.inference_mode():
        for i in range(steps):
            for f, t in zip(fns, times):
                t0 = time.perf_counter()
                f(i)
                sync()
                t.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t[warmup:]) for t in times]


def main() -> None:
    ap = cli.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smol", help="the model (tiny | smol | smollm2 | PATH)")
    ap.add_argument("--batches", default="1,8,32,64", help="decode batch sizes, comma-separated")
    ap.add_argument("--contexts", default="128,400", help="context lengths, comma-separated")
    ap.add_argument("--steps", type=int, default=8, help="timed decode steps per point")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the model's dtype")
    ap.add_argument("--quick", action="store_true", help="batch 1 and 64 at 128 context, 4 steps")
    ap.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(ap)
    a = ap.parse_args()
    start = prov.begin("forward", a.json, a.allow_dirty)
    batches = [int(x) for x in a.batches.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    steps, warmup = a.steps, 2
    if a.quick:
        batches, contexts, steps, warmup = [1, 64], [128], 4, 1

    from transformers import AutoModelForCausalLM
    need = max(batches) * blocks_needed(max(contexts) + steps + warmup, 16)  # block size 16
    runner = make_runner(a.model, num_blocks=need, device=a.device, dtype=a.dtype)
    stock = AutoModelForCausalLM.from_pretrained(float_checkpoint(*resolve_checkpoint(a.model)),
                                                 dtype=getattr(torch, a.dtype),
                                                 attn_implementation="sdpa").to(a.device).eval()
    sync = torch.cuda.synchronize if runner.kv.is_cuda else (lambda: None)
    rows = []
    print(f"{a.model} {a.dtype} on {a.device}, {torch.get_num_threads()} threads; "
          "median ms per decode step")
    print(f"{'batch':>5} {'ctx':>5} {'paged ms':>9} {'stock ms':>9} {'paged tok/s':>11} "
          f"{'stock tok/s':>11} {'stock/paged':>11}")
    for ctx in contexts:
        for b in batches:
            p, s = interleaved_ms([paged_steps(runner, b, ctx, warmup + steps),
                                   stock_steps(stock, b, ctx)], warmup + steps, warmup, sync)
            rows.append({"batch": b, "context": ctx, "paged_ms": p, "stock_ms": s,
                         "paged_tok_s": b * 1e3 / p, "stock_tok_s": b * 1e3 / s,
                         "speedup": s / p})
            r = rows[-1]
            print(f"{b:>5} {ctx:>5} {p:>9.1f} {s:>9.1f} {r['paged_tok_s']:>11.1f} "
                  f"{r['stock_tok_s']:>11.1f} {r['speedup']:>11.2f}", flush=True)
    if a.json:
        bl.write_json(a.json, prov.stamp({"dtype": a.dtype, "device": a.device,
                                          "threads": torch.get_num_threads(),
                                          "torch": torch.__version__, "rows": rows},
                                         start, a.model))


if __name__ == "__main__":
    main()
