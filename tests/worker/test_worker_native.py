"""The C decode-attention kernel (worker/native.py): against a float64 reference on
scattered block tables, and a model using it against transformers' generate; its KV write
against index_copy_."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from worker import native
from worker.handmade import Part, make_batch
from worker.load import make_runner
from worker.step import build_step, seq_slots

from tests.checkpoints import make_checkpoint
from tests.worker.test_worker_engine import alone, prompts, stock_greedy

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: the worker uses the torch path")


def reference(q, k, v, tables, ctx):
    """Float64 attention of each sequence's query heads over its first ctx positions."""
    n, heads, dim = q.shape
    kv_heads, bs = k.shape[2], k.shape[1]
    out = torch.empty(n, heads, dim, dtype=torch.float64)
    for i in range(n):
        pos = torch.arange(int(ctx[i]))
        rows = seq_slots(tables[i], pos, bs)
        ki = k.reshape(-1, kv_heads, dim)[rows].double()          # [ctx, KVH, D]
        vi = v.reshape(-1, kv_heads, dim)[rows].double()
        kh = ki.repeat_interleave(heads // kv_heads, dim=1)      # head h uses KV head h // rep
        vh = vi.repeat_interleave(heads // kv_heads, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q[i].double(), kh) / dim ** 0.5, -1)
        out[i] = torch.einsum("ht,thd->hd", w, vh)
    return out


@pytest.mark.parametrize("dim,rep,bs,sharp", [(64, 1, 16, 1), (64, 3, 16, 1), (128, 4, 16, 1),
                                              (64, 2, 8, 1), (64, 3, 16, 40), (64, 6, 16, 1),
                                              (16, 2, 16, 1), (48, 3, 8, 1)])
def test_kernel_matches_float64_reference(dim, rep, bs, sharp):
    """sharp: scores spread over hundreds, so most weights underflow to 0. Head dims 16 and
    48 take the looped code (the batch-invariant mode's)."""
    gen = torch.Generator().manual_seed(dim + rep + bs)
    kv_heads, blocks = 2, 80
    lengths = [1, 15, 16, 17, 100, 300, 33]
    width = -(-max(lengths) // bs)
    tables = torch.tensor([random.Random(i).sample(range(blocks), width)  # scattered
                           for i in range(len(lengths))], dtype=torch.long)
    ctx = torch.tensor(lengths, dtype=torch.long)
    k = torch.randn(blocks, bs, kv_heads, dim, generator=gen) * 2
    v = torch.randn(blocks, bs, kv_heads, dim, generator=gen)
    q = torch.randn(len(lengths), kv_heads * rep, dim, generator=gen) * 2 * sharp
    got = native.paged_decode(q, k, v, tables, ctx, dim ** -0.5)
    assert (got.double() - reference(q, k, v, tables, ctx)).abs().max() < 2e-5


@pytest.mark.parametrize("bs", [16, 8, 48])
def test_long_contexts_split_into_parts_match_the_reference_and_each_other(bs):
    """Contexts past 256 positions are attended in parts merged in a fixed order: the
    result matches float64, and a decode's output does not depend on the batch around it
    (the batch-invariant mode's requirement)."""
    gen = torch.Generator().manual_seed(bs)
    kv_heads, rep, dim, blocks = 3, 3, 64, 400
    lengths = [1800, 257, 256, 1, 700, 513]
    width = -(-max(lengths) // bs)
    tables = torch.tensor([random.Random(i).sample(range(blocks), width)
                           for i in range(len(lengths))], dtype=torch.long)
    ctx = torch.tensor(lengths, dtype=torch.long)
    k = torch.randn(blocks, bs, kv_heads, dim, generator=gen)
    v = torch.randn(blocks, bs, kv_heads, dim, generator=gen)
    q = torch.randn(len(lengths), kv_heads * rep, dim, generator=gen) * 2
    got = native.paged_decode(q, k, v, tables, ctx, dim ** -0.5)
    assert (got.double() - reference(q, k, v, tables, ctx)).abs().max() < 2e-5
    for i in range(len(lengths)):
        alone = native.paged_decode(q[i:i + 1], k, v, tables[i:i + 1], ctx[i:i + 1], dim ** -0.5)
        assert torch.equal(alone[0], got[i]), lengths[i]


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-avx512f")],
                         ids=["avx2", "generic"])
def test_every_instruction_set_gives_the_same_bits(flags):
    """AVX2 has its own 8-wide code (paged_decode.c); built here with AVX-512 turned off
    (the AVX2 code), or AVX2 too (the generic 16-lane code), the kernel sums every score,
    weight sum and output in the native build's order: the same bits, so a log replays
    alike on another machine with fused multiply-adds (without them, -mno-avx, the products
    round apart)."""
    other = native.attention_lib(flags)
    assert other is not None
    gen = torch.Generator().manual_seed(5)
    # reps 5 and 3: a group of heads (4 of dim 64, 2 of 128, on AVX-512) and one left over
    for dim, rep, bs in ((64, 3, 16), (64, 5, 16), (128, 2, 16), (128, 3, 16), (48, 1, 8)):
        kv_heads, blocks, lengths = 2, 60, [1, 7, 8, 9, 16, 23, 300]
        width = -(-max(lengths) // bs)
        tables = torch.tensor([random.Random(i).sample(range(blocks), width)
                               for i in range(len(lengths))], dtype=torch.long)
        ctx = torch.tensor(lengths, dtype=torch.long)
        k, v = (torch.randn(blocks, bs, kv_heads, dim, generator=gen) for _ in range(2))
        q = torch.randn(len(lengths), kv_heads * rep, dim, generator=gen)
        args = (q, k, v, tables, ctx, dim ** -0.5)
        assert torch.equal(native.kernel_decode(*args, lib=other),
                           native.kernel_decode(*args)), (dim, rep, bs)


@pytest.fixture(scope="module")
def d64_dir(tmp_path_factory):
    """Head dim 64 (what the kernel takes), 2 query heads per KV head."""
    return make_checkpoint(tmp_path_factory, "d64", 5, {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 320}, init_std=0.1)


def test_model_on_the_kernel_matches_transformers_generate(d64_dir):
    r = make_runner(str(d64_dir), num_blocks=64)
    assert r.native
    stock = AutoModelForCausalLM.from_pretrained(d64_dir, attn_implementation="sdpa")
    odd_blocks = range(r.info.num_blocks - 1, 0, -2)
    for p in prompts(320, (1, 17, 100, 300), seed=3):
        assert alone(r, p, 12, blocks=odd_blocks) == stock_greedy(stock, p, 12), len(p)


def test_kernel_and_torch_path_give_the_same_logits(d64_dir):
    r = make_runner(str(d64_dir), num_blocks=64)
    rng = random.Random(7)
    seqs = [[rng.randrange(320) for _ in range(n)] for n in (5, 40, 160, 33)]
    tables, free = [], list(range(64))
    rng.shuffle(free)
    for s in seqs:
        n = -(-len(s) // 16)
        tables.append(free[:n])
        free = free[n:]
    r.logits(make_batch([Part(s, 0, len(s) - 1, t, sample=False) for s, t in zip(seqs, tables)],
                        16))
    decode = make_batch([Part(s, len(s) - 1, 1, t) for s, t in zip(seqs, tables)], 16)
    fast = r.logits(decode)
    r.native = False
    try:
        slow = r.logits(decode)
    finally:
        r.native = True
    assert (fast - slow).abs().max() < 1e-4


def test_heads_the_kernel_does_not_take_use_torch():
    assert not make_runner("tiny", num_blocks=8).native   # head dim 16


def test_tables_outside_the_pool_are_refused_before_the_kernel(d64_dir):
    r = make_runner(str(d64_dir), num_blocks=8)
    bad = make_batch([Part([1, 2, 3], 2, 1, [0, 99])], 16)  # slots in block 0 are fine
    with pytest.raises(ValueError, match="outside the KV pool"):
        build_step(bad, r.kv, r.native)


@pytest.mark.parametrize("tokens", (1, 5, 33))
def test_kv_write_equals_index_copy(tokens):
    """The step's keys and values (transposed views, as the attention gets them) land where
    index_copy_ along the pool's flattened rows puts them, bit for bit."""
    g = torch.Generator().manual_seed(tokens)
    pool = torch.randn(2, 40, 8, 3, 64, generator=g)   # one layer: [2, N, B, KVH, D]
    slots = torch.randperm(40 * 8, generator=g)[:tokens]
    k = torch.randn(1, tokens, 3, 64, generator=g).transpose(1, 2)[0]   # [KVH, T, D]
    v = torch.randn(3, tokens, 64, generator=g)                        # another layout
    want = pool.clone()
    flat = want.view(2, -1, 3, 64)
    flat[0].index_copy_(0, slots, k.transpose(0, 1))
    flat[1].index_copy_(0, slots, v.transpose(0, 1))
    native.kernel_kv_write(pool, slots, k, v)
    assert torch.equal(pool, want)


def test_kv_write_outside_the_pool_is_refused_and_writes_nothing():
    pool = torch.zeros(2, 4, 8, 3, 64)
    k = torch.ones(3, 2, 64)
    for bad in ([0, 32], [-1, 0]):
        with pytest.raises(ValueError):
            native.kernel_kv_write(pool, torch.tensor(bad), k, k)
        assert not pool.any()
