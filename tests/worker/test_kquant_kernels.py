"""The quantized kernel on the types llama.cpp's Q4_K_M / Q5_K_M / Q6_K files are made of
(Q5_0, Q5_1 in blocks of 32 weights; Q4_K, Q5_K, Q6_K in super-blocks of 256): random valid
blocks (random bytes, the fp16 scales finite), decoded bit for bit as gguf-py decodes them,
multiplied within float32's accumulation bound of the exact product of gguf-py's weights (and
outside it when a scale, a min, a sub-block scale or a high bit is damaged), every row the
same bits alone, in any batch, on 1 or 2 threads and on every instruction set.

The bound is test_quant_kernels.py's: gamma(in / 16 + 6) * (sum_k |x_k w_nk| + |b_n|) for the
kernel (sixteen fma chains of in / 16 steps, a four-level tree, the bias), gamma(in + 2) for
torch's fallback, with the weights gguf-py gives in float32 (the kernel's own).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.worker.test_quant_kernels import (U, batch_invariant, chain, lib,  # noqa: F401
                                             path)  # lib, path: fixtures
from worker import native
from worker.linear import quant
from worker.linear.quant_fuse import fuse
from worker.linear.quant_module import QuantEmbedding, QuantLinear

NEW = [quant.Q5_0, quant.Q5_1, quant.Q4_K, quant.Q5_K, quant.Q6_K]
# where each type's fp16 scales sit in its block (ggml's layouts, csrc/quant_blocks.h)
HALVES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q2_K": (80, 82)}
SIZES = {"Q3_K": 110, "Q2_K": 84}   # bytes of the 256-weight types the kernel lacks


def gguf_type(name: str):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType[name]


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes] of random blocks of type `name` for rows of `cols` weights: every byte
    random, the fp16 scales replaced by finite values of either sign, 1e-3 to 4e-3 in size."""
    qtype = quant.TYPES.get(name)
    size = qtype.block_bytes if qtype else SIZES[name]
    block = qtype.block if qtype else 256
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in HALVES[name]:
        v = rng.uniform(1e-3, 4e-3, raw.shape[:2]) * rng.choice([-1, 1], raw.shape[:2])
        raw[..., at:at + 2] = v.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def weight(qtype: quant.QuantType, rows: int, cols: int, seed: int = 0) -> quant.QuantWeight:
    return quant.QuantWeight(torch.from_numpy(random_blocks(qtype.name, rows, cols, seed)),
                             qtype, (rows, cols))


def gguf_weights(qw: quant.QuantWeight) -> np.ndarray:
    """gguf-py's float32 dequantization of the same bytes."""
    from gguf import quants
    return quants.dequantize(qw.data.numpy(), gguf_type(qw.qtype.name))


def within_bound(y: torch.Tensor, x: torch.Tensor, w: np.ndarray, b: torch.Tensor | None,
                 steps: int) -> bool:
    """y against the float64 product of x and the float32 weights w, within gamma(steps)."""
    w64 = torch.from_numpy(w.astype(np.float64))
    exact, scale = x.double() @ w64.T, x.double().abs() @ w64.abs().T
    if b is not None:
        exact, scale = exact + b.double(), scale + b.double().abs()
    gamma = steps * U / (1 - steps * U)
    return bool(((y.double() - exact).abs() <= gamma * scale).all())


def cols_of(qtype: quant.QuantType) -> int:
    return 2 * qtype.block + (0 if qtype.block == 256 else 3 * 32)   # 512, or 160


@pytest.mark.parametrize("qtype", list(quant.TYPES.values()), ids=lambda t: t.name)
def test_dequantize_is_gguf_py_s_bits(qtype):
    qw = weight(qtype, 7, cols_of(qtype))
    got, want = quant.dequantize(qw).numpy(), gguf_weights(qw)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))   # -0.0 too
    exact = quant.dequantize(qw, torch.float64).numpy()
    assert np.array_equal(exact.astype(np.float32), want)   # each the nearest float32


@pytest.mark.parametrize("qtype", NEW, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 7, 17, 64])
def test_outputs_within_the_float32_bound(path, qtype, m):  # noqa: F811
    k = cols_of(qtype)
    qw, x, b = weight(qtype, 101, k, seed=m), torch.randn(m, k), torch.randn(101)
    y = quant.matmul(x, qw, b)
    assert y.shape == (m, 101) and y.dtype == torch.float32
    assert within_bound(y, x, gguf_weights(qw), b, chain(path, k))


def flip(offset: int, bit: int):
    def damage(block: np.ndarray) -> None:
        block[offset] ^= 1 << bit
    damage.__name__ = f"byte{offset}bit{bit}"
    return damage


# (type, what, the byte and bit flipped in one block): an fp16 scale's lowest exponent bit
# (x 2^+-1), a 6-bit sub-block scale or min (low bits in bytes 4-7 for runs 0-3, top bits
# of runs 4-7 there too, low nibbles in bytes 8-11), an int8 scale, a fifth or sixth bit
DAMAGE = [("Q5_0", "d", 1, 2), ("Q5_0", "high bit", 3, 5),
          ("Q5_1", "d", 1, 2), ("Q5_1", "m", 3, 2), ("Q5_1", "high bit", 6, 0),
          ("Q4_K", "d", 1, 2), ("Q4_K", "dmin", 3, 2), ("Q4_K", "scale 1", 5, 0),
          ("Q4_K", "min 2", 10, 0), ("Q4_K", "scale 5 low", 9, 1), ("Q4_K", "min 6 low", 14, 5),
          ("Q4_K", "scale 4 top", 4, 6), ("Q4_K", "min 7 top", 11, 7),
          ("Q5_K", "d", 1, 2), ("Q5_K", "dmin", 3, 2), ("Q5_K", "scale 6", 14, 0),
          ("Q5_K", "min 3", 11, 1), ("Q5_K", "high bit run 5", 20, 5),
          ("Q6_K", "d", 209, 2), ("Q6_K", "scale 11", 203, 1), ("Q6_K", "high bits", 150, 4),
          ("Q6_K", "low nibble", 100, 6)]


@pytest.mark.parametrize("name,what,offset,bit", DAMAGE, ids=[f"{d[0]}-{d[1]}" for d in DAMAGE])
def test_a_damaged_block_fails_the_check(path, name, what, offset, bit):  # noqa: F811
    qtype = quant.TYPES[name]
    k = cols_of(qtype)
    # x seeded: a flipped min moves a run's weights alike, so its effect is the run's sum of
    # x, which an unseeded x (whatever ran before) once had near 0 in every row
    qw, x = weight(qtype, 9, k), torch.randn(4, k, generator=torch.Generator().manual_seed(3))
    w = gguf_weights(qw)
    assert within_bound(quant.matmul(x, qw), x, w, None, chain(path, k))
    data = qw.data.numpy().copy()
    blocks = data.reshape(9, k // qtype.block, qtype.block_bytes)
    flip(offset, bit)(blocks[4, 1])                     # row 4's second block
    broken = quant.QuantWeight(torch.from_numpy(data), qtype, qw.shape)
    assert not np.array_equal(gguf_weights(broken), w), what   # the bytes meant something
    assert not within_bound(quant.matmul(x, broken), x, w, None, chain(path, k)), what


@pytest.mark.parametrize("qtype", NEW, ids=lambda t: t.name)
def test_a_rows_result_does_not_depend_on_the_batch(lib, qtype):  # noqa: F811
    # 101 columns: two of the kernel's 48-column decoded chunks and a ragged third
    k = cols_of(qtype)
    qw, x, b = weight(qtype, 101, k), torch.randn(70, k), torch.randn(101)
    batch_invariant(qw, x, b, (2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 33, 64, 70))


@pytest.mark.parametrize("flags,isa", [(("-mno-avx512f",), "avx2"), (("-mno-avx",), "scalar")])
def test_every_instruction_set_sums_in_the_same_order(lib, flags, isa):  # noqa: F811
    other = quant.load(flags)
    if isa == "avx2" and "avx2" not in native.cpu_flags().split():
        isa = "scalar"
    assert quant.isa(other) == isa
    for qtype in NEW:
        k = cols_of(qtype)
        qw, x, b = weight(qtype, 53, k), torch.randn(20, k), torch.randn(53)
        for m in (1, 5, 7, 20):                  # tiles that decode; decoded weights
            assert torch.equal(quant.matmul(x[:m], qw, b, lib=other),
                               quant.matmul(x[:m], qw, b, lib=lib)), (qtype.name, m)


@pytest.mark.parametrize("qtype", [quant.Q4_K, quant.Q5_K, quant.Q6_K], ids=lambda t: t.name)
def test_a_row_of_part_of_a_super_block_is_refused(qtype):
    with pytest.raises(ValueError, match="multiple of 256"):
        quant.QuantWeight(torch.zeros(4, qtype.block_bytes, dtype=torch.uint8), qtype, (4, 160))
    data = torch.from_numpy(random_blocks(qtype.name, 4, 256))
    if quant.kernel() is not None:               # the kernel checks k against the type too
        with pytest.raises(ValueError, match="refused"):
            quant.blocks_matmul(torch.randn(2, 128), data, qtype.ggml_id)


@pytest.mark.parametrize("qtype", NEW, ids=lambda t: t.name)
def test_an_embedding_lookup_is_the_dequantized_rows(qtype):
    qw = weight(qtype, 30, cols_of(qtype))
    ids = torch.tensor([[3, 0, 29], [3, 7, 7]])
    got = QuantEmbedding(qw)(ids)
    assert torch.equal(got, torch.from_numpy(gguf_weights(qw))[ids])


class Attention(nn.Module):
    """q, k, v reading one input, in the types given (a Q4_K_M file mixes Q4_K and Q6_K)."""

    def __init__(self, types: list[quant.QuantType]):
        super().__init__()
        self.q, self.k, self.v = (QuantLinear(weight(t, 24 + i, 256, seed=i))
                                  for i, t in enumerate(types))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


@pytest.mark.parametrize("types,fused", [
    ([quant.Q4_K, quant.Q4_K, quant.Q6_K], [(quant.Q4_K, 24 + 25)]),
    ([quant.Q6_K, quant.Q4_K, quant.Q4_K], [(quant.Q4_K, 25 + 26)]),
    ([quant.Q4_K, quant.Q6_K, quant.Q4_K], []),
    ([quant.Q5_0, quant.Q5_0, quant.Q5_0], [(quant.Q5_0, 24 + 25 + 26)])], ids=str)
def test_only_weights_of_one_type_are_fused(types, fused):
    model, x = Attention(types), torch.randn(3, 256)
    want = model(x)
    made = fuse(model, lambda: model(x))
    assert [(f.layer.qweight.qtype, f.layer.out_features) for f in made] == fused
    assert torch.equal(model(x), want)
