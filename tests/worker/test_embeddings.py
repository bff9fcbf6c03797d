"""Embeddings on the trained model (the `smollm2` preset, served on its quantized blocks)
against transformers on the same dequantized weights (docs/design/worker.md, "Embeddings"):
the last layer's hidden state after the final norm (output_hidden_states), at the last
token, L2-normalised, within 1e-5; alone, batched, chunked, and beside generation in the
same steps."""
from __future__ import annotations

import pytest
import torch

from core.blocks import FreeListBlocks
from core.engine import Engine
from core.prefill import Chunked
from core.sched import Finished, Request, Scheduler, SchedulerConfig
from tests.worker.test_worker_engine import GREEDY

TOL = 1e-5
PROMPTS = ([1, 2, 3], [5], list(range(100, 140)), list(range(7, 300, 3)), [42] * 17)


def reference(model, prompt: list[int]) -> torch.Tensor:
    """transformers' pooled vector: last hidden state (after the norm), last token, L2."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model(ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    return torch.nn.functional.normalize(out.hidden_states[-1][0, -1].float(), dim=-1)


def embed(trained_runner, prompts, gens=(), max_chunk=None, max_batch_tokens=512):
    """Each prompt's vector from one engine, with `gens` ([(prompt, max_tokens)]) generating
    in the same steps; also whether some step ran a pooled chunk beside a decode."""
    info = trained_runner.info
    cfg = SchedulerConfig(max_seqs=16, max_batch_tokens=max_batch_tokens,
                          max_model_len=info.max_model_len)
    sched = Scheduler(cfg, FreeListBlocks(info.block_size, range(info.num_blocks)),
                      Chunked(max_chunk) if max_chunk else None)
    eng = Engine(sched, trained_runner, eos_ids=info.eos_ids)
    gen_ids = [eng.add(Request(list(p), n), GREEDY, ignore_eos=True) for p, n in gens]
    ids = [eng.add(Request(list(p), 1, embed=True)) for p in prompts]
    got, beside, tokens = {}, False, {i: 0 for i in gen_ids}
    while eng.busy():
        done = eng.step()
        out = eng.last_schedule
        beside |= bool(out.pooled and out.decode)
        got.update({i: torch.tensor(list(v)) for i, v in done.embeddings})
        for ev in done.events:
            if not isinstance(ev, Finished) and ev.id in tokens:
                tokens[ev.id] += 1
    return [got[i] for i in ids], beside, tokens


def test_the_hidden_size_is_announced(trained_runner, trained_stock):
    assert trained_runner.info.hidden_size == trained_stock.config.hidden_size == 576


def test_alone_each_equals_transformers(trained_runner, trained_stock):
    for p in PROMPTS:
        (v,), _, _ = embed(trained_runner, [p])
        want = reference(trained_stock, p)
        assert v.shape == want.shape and abs(v.norm().item() - 1) < 1e-5
        assert (v - want).abs().max().item() < TOL, p


def test_batched_chunked_and_beside_generation_each_equals_transformers(trained_runner,
                                                                        trained_stock):
    gens = [([9, 8, 7], 30), (list(range(50, 90)), 25)]
    vs, beside, tokens = embed(trained_runner, PROMPTS * 2, gens, max_chunk=32, max_batch_tokens=96)
    assert beside and all(n == 30 or n == 25 for n in tokens.values())
    for p, v in zip(PROMPTS * 2, vs):
        assert (v - reference(trained_stock, p)).abs().max().item() < TOL, p
