"""The worker over prefix-cache hits: a prefill that starts after cached blocks attends to
K/V another request wrote. Greedy tokens against transformers' generate with no, partial
and full-prompt-minus-one hits, alone and batched, with preemption refilling from cache."""
from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from core.engine import Engine
from core.sched import Chunked, PrefixCacheBlocks, Request, Scheduler, SchedulerConfig
from worker.load import make_runner, resolve_model

from tests.worker.test_worker_engine import GREEDY, prompts, qwen2_dir, stock_greedy  # noqa: F401


def cached_engine(runner, blocks=None, max_chunk=None, max_seqs=16) -> Engine:
    info = runner.info
    cfg = SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=512, max_model_len=info.max_model_len)
    pool = PrefixCacheBlocks(info.block_size, range(info.num_blocks) if blocks is None else blocks)
    sched = Scheduler(cfg, pool, Chunked(max_chunk) if max_chunk else None)
    return Engine(sched, runner, eos_ids=info.eos_ids)


def generate(eng: Engine, batch: list[list[int]], n: int) -> tuple[list[list[int]], list[int]]:
    """Run the prompts together; their tokens and each one's cached positions at admission."""
    hits: dict[int, int] = {}
    ids = [eng.add(Request(list(p), n), GREEDY, ignore_eos=True) for p in batch]
    done = {}
    while eng.sched.has_unfinished():
        outs = {i: live.output for i, live in eng.live.items()}
        for ev in eng.step().events:
            if type(ev).__name__ == "Finished":
                done[ev.id] = outs[ev.id]
        for i, c in eng.last_hits:
            hits.setdefault(i, c)
    return [done[i] for i in ids], [hits.get(i, 0) for i in ids]


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_cache_hits_give_transformers_tokens(which, qwen2_dir):  # noqa: F811
    path = resolve_model("tiny") if which == "tiny" else qwen2_dir
    runner = make_runner(str(path), num_blocks=96)
    stock = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    vocab, B = runner.info.vocab_size, runner.info.block_size
    (base,) = prompts(vocab, (100,), seed=11)
    other, tail = prompts(vocab, (37, 9), seed=12)
    eng = cached_engine(runner)
    cases = [(base, 0),                      # cold: no hit
             (base[:40] + tail, 32),         # partial: the two full blocks of the shared 40
             (base, 96),                     # the whole prompt but its last block
             (other, 0)]
    for p, want_hit in cases:
        (got,), (hit,) = generate(eng, [p], 10)
        assert hit == want_hit and got == stock_greedy(stock, p, 10), (len(p), hit)
    batch = [base[:64] + t for t in prompts(vocab, (5, 17, 30), seed=13)]
    got, hits = generate(eng, batch, 10)
    assert hits == [64, 64, 64] and all(h % B == 0 for h in hits)
    assert got == [stock_greedy(stock, p, 10) for p in batch]


def test_preempted_requests_refill_from_their_own_blocks():
    runner = make_runner("tiny", num_blocks=64)
    ps = prompts(runner.info.vocab_size, (40, 52, 47, 45), seed=14)
    roomy, _ = generate(cached_engine(runner), ps, 40)
    eng = cached_engine(runner, blocks=range(1, 28, 2))     # 14 scattered blocks: preemption
    tight, _ = generate(eng, ps, 40)
    assert eng.sched.stats().preemptions > 0
    assert eng.sched.blocks.prefix_recompute_hit_tokens > 0
    assert tight == roomy
