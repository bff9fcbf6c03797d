"""The paged attention path against the stock transformers model (sdpa), logits level."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.masking_utils import create_causal_mask

from worker.attention import NAME
from worker.handmade import Part, make_batch
from worker.load import make_runner, resolve_model

TOL = 1e-4  # fp32; the model's own eager-vs-sdpa noise is ~2e-5
BS = 16
NUM_BLOCKS = 96


@pytest.fixture(scope="module")
def runner():
    return make_runner("tiny", num_blocks=NUM_BLOCKS, block_size=BS)


@pytest.fixture(scope="module")
def stock():
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), attn_implementation="sdpa")


def ref_logits(stock, tokens) -> torch.Tensor:
    with torch.inference_mode():
        return stock(torch.tensor([list(tokens)])).logits[0, -1]


class Pool:
    """Shuffled block ids: every table is non-contiguous and out of order."""

    def __init__(self, seed: int):
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def take(self, tokens: int) -> list[int]:
        n = -(-tokens // BS)
        out, self.free = self.free[:n], self.free[n:]
        return out


def check(runner, stock, batch, seqs) -> float:
    """Compare each sample row with the stock model on that row's whole sequence."""
    got = runner.logits(batch)
    assert got.shape == (len(seqs), runner.info.vocab_size)
    worst = 0.0
    for row, toks in zip(got, seqs):
        worst = max(worst, (row - ref_logits(stock, toks)).abs().max().item())
    assert worst <= TOL
    return worst


def test_prefill_decode_and_mixed_steps_match_stock(runner, stock):
    rng = random.Random(1)
    pool = Pool(2)
    a, b, c = ([rng.randrange(512) for _ in range(n)] for n in (50, 17, 130))
    ta, tb, tc = pool.take(70), pool.take(40), pool.take(140)
    te, tf = pool.take(4), pool.take(4)
    assert ta != sorted(ta)

    # prefill: two whole prompts in one step
    check(runner, stock, make_batch([Part(a, 0, 50, ta), Part(b, 0, 17, tb)], BS), [a, b])
    a.append(7)
    b.append(9)
    # decode: two sequences of different lengths
    check(runner, stock, make_batch([Part(a, 50, 1, ta), Part(b, 17, 1, tb)], BS), [a, b])
    a.append(11)
    b.append(13)
    # mixed, with a chunk that samples nothing
    batch = make_batch([Part(a, 51, 1, ta), Part(b, 18, 1, tb),
                        Part(c, 0, 60, tc, sample=False)], BS)
    check(runner, stock, batch, [a, b])
    a.append(3)
    b.append(5)
    # mixed: decodes, a one-token prompt, a chunk at start 60, a one-token prompt after it
    e, f = [42], [99]
    batch = make_batch([Part(a, 52, 1, ta), Part(b, 19, 1, tb), Part(e, 0, 1, te),
                        Part(c, 60, 70, tc), Part(f, 0, 1, tf)], BS)
    check(runner, stock, batch, [a, b, e, c, f])


def test_long_prefill_in_uneven_chunks(runner, stock):
    rng = random.Random(3)
    toks = [rng.randrange(512) for _ in range(300)]
    table = Pool(4).take(300)
    for start, n in ((0, 1), (1, 150), (151, 149)):
        batch = make_batch([Part(toks, start, n, table)], BS)
        check(runner, stock, batch, [toks[:start + n]])


def test_no_mask_is_built_for_tl_paged(runner):
    """transformers 5.24 builds no causal mask for an attention name without a mask function."""
    cfg = runner.model.config
    assert cfg._attn_implementation == NAME
    emb = torch.zeros(1, 500, cfg.hidden_size)
    pos = torch.arange(500)[None]
    assert create_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None,
                              position_ids=pos) is None


def test_logits_to_keep_rows_follow_sample_rows(runner, stock):
    """Only sampling rows get logits, in sample_rows order, even when rows skip sequences."""
    pool = Pool(5)
    x, y = list(range(1, 30)), list(range(100, 140))
    batch = make_batch([Part(x, 0, 29, pool.take(29), sample=False),
                        Part(y, 0, 40, pool.take(40))], BS)
    check(runner, stock, batch, [y])


def test_empty_step_and_no_sample_rows(runner):
    assert len(runner.execute(make_batch([], BS))) == 0
    batch = make_batch([Part([1, 2, 3], 0, 3, [5], sample=False)], BS)
    assert len(runner.execute(batch)) == 0


def test_slots_past_the_pool_are_refused(runner):
    batch = make_batch([Part([1, 2], 0, 2, [NUM_BLOCKS])], BS)
    with pytest.raises(ValueError):
        runner.execute(batch)


def test_decodes_of_very_different_lengths_are_grouped_and_match_stock(runner, stock):
    from worker.step import build_step
    rng = random.Random(5)
    pool = Pool(6)
    lens = [40, 3, 600, 20, 300, 120]           # unsorted on purpose
    seqs = [[rng.randrange(512) for _ in range(n)] for n in lens]
    tables = [pool.take(n + 2) for n in lens]
    runner.logits(make_batch([Part(s, 0, len(s), t) for s, t in zip(seqs, tables)], BS))
    for s in seqs:
        s.append(rng.randrange(512))
    batch = make_batch([Part(s, len(s) - 1, 1, t) for s, t in zip(seqs, tables)], BS)
    groups = build_step(batch, runner.kv).paged.decode_groups
    assert len(groups) > 1 and sum(len(g.tables) for g in groups) == len(seqs)
    check(runner, stock, batch, seqs)
