"""The quantized linear kernel (worker/csrc/quant_gemm.c, worker/linear/quant.py): blocks
written and read as gguf-py does, outputs within float32's accumulation bound of the exact
product on odd shapes (and outside it when a block is damaged), and every row bit for bit
the same alone, in any batch, on any thread count and on every instruction-set path.

The bound: the kernel's weights are the exact ones rounded once (d * q is exact in float32,
Q4_1's + m rounds), and each output is sixteen fma chains of in / 16 steps, a four-level
tree and the bias add, so |y - exact| <= gamma(in / 16 + 6) * (sum_k |x_k w_nk| + |b_n|),
gamma(m) = m u / (1 - m u), u = 2^-24 (Higham's bound for a sum whose every term passes m
roundings). torch's fallback sums in MKL's order: gamma(in + 2).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from worker import native
from worker.linear import quant
from worker.linear.quantize import quantize

TYPES = [quant.Q8_0, quant.Q4_0, quant.Q4_1]
U = 2.0 ** -24


def gguf_type(qtype: quant.QuantType):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType[qtype.name]


def weight(out: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random rows with what trips quantizers: a zero block, a constant block, equal |max|."""
    w = torch.randn(out, k, generator=torch.Generator().manual_seed(seed))
    w[0, :32] = 0
    if k >= 64:
        w[-1, 32:64] = 0.75
    w[out // 2, 3], w[out // 2, 9] = 2.5, -2.5
    return w


def rows(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


def chain(path: str, k: int) -> int:
    return k // 16 + 6 if path == "kernel" else k + 2


def within_bound(y: torch.Tensor, x: torch.Tensor, qw: quant.QuantWeight,
                 b: torch.Tensor | None, steps: int) -> bool:
    """y against the exact product of x and qw's weights, within gamma(steps)."""
    w = quant.dequantize(qw, torch.float64)
    exact = x.double() @ w.T
    scale = x.double().abs() @ w.abs().T
    if b is not None:
        exact, scale = exact + b.double(), scale + b.double().abs()
    gamma = steps * U / (1 - steps * U)
    return bool(((y.double() - exact).abs() <= gamma * scale).all())


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    """The C kernel, or torch's fallback as where no compiler is."""
    if request.param == "kernel" and quant.kernel() is None:
        pytest.skip("quantized kernel unavailable: no C compiler")
    if request.param == "torch":
        monkeypatch.setattr(quant, "kernel", lambda: None)
    return request.param


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_blocks_are_ggml_s_bytes_and_weights(qtype):
    from gguf import quants
    w = weight(37, 160)
    qw = quantize(w, qtype)
    want = quants.quantize(w.numpy(), gguf_type(qtype))
    assert np.array_equal(qw.data.numpy(), want)
    assert np.array_equal(quant.dequantize(qw).numpy(), quants.dequantize(want, gguf_type(qtype)))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 31, 33, 512])
@pytest.mark.parametrize("n", [1, 5, 33, 100])
def test_outputs_within_the_float32_bound(path, qtype, m, n):
    qw, x = quantize(weight(n, 96), qtype), rows(m, 96)
    b = torch.randn(n)
    y = quant.matmul(x, qw, b)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert within_bound(y, x, qw, b, chain(path, 96))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [32, 2048])
def test_short_and_long_rows_within_the_bound(path, qtype, k):
    qw, x = quantize(weight(7, k), qtype), rows(3, k)
    assert within_bound(quant.matmul(x[None], qw)[0], x, qw, None, chain(path, k))


def break_scale(data: np.ndarray, qtype, block: int) -> None:
    data[block * qtype.block_bytes + 1] ^= 0x04        # the fp16's lowest exponent bit: d x 2^+-1


def break_min(data: np.ndarray, qtype, block: int) -> None:
    data[block * qtype.block_bytes + 3] ^= 0x04


def swap_nibbles(data: np.ndarray, qtype, block: int) -> None:
    """Elements j and j + 16 of the block swapped (Q8_0: its two halves' first bytes)."""
    start = block * qtype.block_bytes + qtype.block_bytes - 16
    if qtype is quant.Q8_0:
        a, b = start - 16, start
        data[a], data[b] = data[b], data[a]
        return
    j = next(i for i in range(start, start + 16) if data[i] & 15 != data[i] >> 4)
    data[j] = (data[j] << 4 | data[j] >> 4) & 0xFF


DAMAGE = [(t, f) for t in TYPES for f in (break_scale, swap_nibbles)] + [(quant.Q4_1, break_min)]


def damage_id(v) -> str:
    return getattr(v, "name", None) or v.__name__


@pytest.mark.parametrize("qtype,damage", DAMAGE, ids=damage_id)
def test_a_damaged_block_fails_the_check(path, qtype, damage):
    qw, x = quantize(weight(9, 96), qtype), rows(4, 96)
    assert within_bound(quant.matmul(x, qw), x, qw, None, chain(path, 96))
    data = qw.data.numpy().copy()
    damage(data.reshape(-1), qtype, block=3 * 4 + 1)        # row 4's second block
    broken = quant.QuantWeight(torch.from_numpy(data), qtype, qw.shape)
    assert not within_bound(quant.matmul(x, broken), x, qw, None, chain(path, 96))


@pytest.fixture(scope="module")
def lib():
    lib = quant.kernel()
    if lib is None:
        pytest.skip("quantized kernel unavailable: no C compiler")
    return lib


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_rows_result_does_not_depend_on_the_batch(lib, qtype):
    # 101 columns: two of the kernel's 48-column decoded chunks and a ragged third; from 16
    # rows on (24 for the 32-weight types on AVX-512, 6 with AVX2), the call multiplies
    # decoded weights (quant_decoded.h, PRE_ROWS and PRE_ROWS_BIG)
    qw, x, b = quantize(weight(101, 128), qtype), rows(300, 128), torch.randn(101)
    batch_invariant(qw, x, b, (2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 16, 17, 23, 24, 25, 31, 33, 64,
                               300))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_long_rows_take_narrower_strips_with_the_same_bits(lib, qtype):
    """Past LONG_ROW (4096) inputs the decoded path takes 24-column strips (quant_decoded.h
    strip_cols): 53 columns are two strips and a ragged 5; rows alone equal rows in calls
    that decode, on AVX-512 and AVX2 alike, within float32's bound of the exact product."""
    k = 4096 + 512
    qw, x, b = quantize(weight(53, k), qtype), rows(40, k), torch.randn(53)
    batch_invariant(qw, x, b, (2, 5, 6, 16, 17, 33, 40))
    y = quant.matmul(x, qw, b)
    assert within_bound(y, x, qw, b, chain("kernel", k))
    avx2 = quant.load(("-mno-avx512f",))
    assert torch.equal(quant.matmul(x, qw, b, lib=avx2), y)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_rows_longer_than_a_chunk_keep_their_bits(lib, qtype):
    """The decoded path takes k in chunks of 256 (quant_decoded.h KC), each output's sums
    waiting in memory between them: 608 inputs are two chunks and a ragged 96 (the
    super-blocks' 512, two chunks, are test_kquant_kernels.py's). Rows alone (the tiles,
    one pass over k) equal rows in calls that decode, AVX-512 = AVX2, within float32's
    bound."""
    k = 608
    qw, x, b = quantize(weight(29, k), qtype), rows(40, k), torch.randn(29)
    batch_invariant(qw, x, b, (16, 24, 25, 40))
    y = quant.matmul(x, qw, b)
    assert within_bound(y, x, qw, b, chain("kernel", k))
    avx2 = quant.load(("-mno-avx512f",))
    assert torch.equal(quant.matmul(x, qw, b, lib=avx2), y)


def batch_invariant(qw: quant.QuantWeight, x: torch.Tensor, b: torch.Tensor, sizes) -> None:
    """Rows alone equal rows in calls of each size in `sizes` (and of rows 7-18), and 1
    thread equals 2 on 1 and 40 rows."""
    alone = torch.cat([quant.matmul(x[i:i + 1], qw, b) for i in range(len(x))])
    for m in sizes:
        assert torch.equal(quant.matmul(x[:m], qw, b), alone[:m]), m
    assert torch.equal(quant.matmul(x[7:19], qw, b), alone[7:19])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [quant.matmul(x[:m], qw) for m in (1, 40)]
        torch.set_num_threads(2)
        assert all(torch.equal(quant.matmul(x[:m], qw), y) for m, y in zip((1, 40), one))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("flags,isa", [(("-mno-avx512f",), "avx2"), (("-mno-avx",), "scalar")])
def test_every_instruction_set_sums_in_the_same_order(lib, flags, isa):
    """The AVX2 and scalar paths, built here with AVX-512 (or AVX) turned off, give the
    native build's bits: the order is the kernel's, not the vector width's."""
    other = quant.load(flags)
    if isa == "avx2" and "avx2" not in native.cpu_flags().split():
        isa = "scalar"
    assert quant.isa(other) == isa
    x, b = rows(20, 96), torch.randn(53)
    for qtype in TYPES:
        qw = quantize(weight(53, 96), qtype)
        for m in (5, 7, 20):                     # tiles that decode; decoded weights
            assert torch.equal(quant.matmul(x[:m], qw, b, lib=other),
                               quant.matmul(x[:m], qw, b, lib=lib)), (qtype.name, m)


def test_wrong_inputs_are_refused_not_misread():
    qw = quantize(weight(4, 64), quant.Q4_1)
    with pytest.raises(TypeError, match="float64"):
        quant.matmul(torch.randn(2, 64, dtype=torch.float64), qw)
    with pytest.raises(ValueError, match="input of 32 features"):
        quant.matmul(torch.randn(2, 32), qw)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.QuantWeight(torch.zeros(4, 20, dtype=torch.uint8), quant.Q4_1, (4, 40))
    with pytest.raises(ValueError, match="uint8 \\[4, 40\\]"):
        quant.QuantWeight(torch.zeros(4, 36, dtype=torch.uint8), quant.Q4_1, (4, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(torch.randn(4, 48), quant.Q8_0)
    assert quant.matmul(torch.randn(0, 64), qw).shape == (0, 4)


def test_quantizing_to_a_type_it_does_not_make_is_a_clear_refusal():
    """The K-quants are read from files; asking to make one names the types it makes."""
    with pytest.raises(ValueError, match="Q8_0, Q4_0, Q4_1 blocks, not Q4_K"):
        quantize(torch.randn(4, 256), quant.Q4_K)
