"""The C row ops (worker/row_ops.py) against float64 references on odd shapes, within a bound
from float32 rounding; a row's bits whatever the call's other rows; and mutants of the
kernel (a dropped eps, a wrong rotary sign, the wrong rotary half) that the checks catch."""
from __future__ import annotations

import pytest
import torch

from worker import row_ops

pytestmark = pytest.mark.skipif(row_ops.kernel() is None, reason="no C compiler here")

U = 2.0 ** -24   # float32's unit roundoff
ROWS = (1, 2, 3, 4, 5, 33)
SIZES = (64, 576, 100)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _norm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x, w = x.double(), w.double()
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def check_rms_norm(lib, rows: int, n: int, scale: float = 1.0, eps: float = 1e-5) -> None:
    g = _gen(rows * 1000 + n)
    x = torch.randn(rows, n, generator=g) * scale
    w = torch.randn(n, generator=g)
    got = row_ops.rms_norm_kernel(x, w, eps, lib)
    # the sum of squares: 16 lanes of n / 16 terms, then 4 levels; then a handful of ops
    bound = (n / 16 + 12) * U
    ref = _norm64(x, w, eps)
    assert ((got.double() - ref).abs() <= bound * ref.abs() + 1e-30).all()


def _rotate64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int):
    """x [T, heads * dim], cos/sin [T, dim] -> (x * cos + rotate_half(x) * sin, the sum of
    the terms' magnitudes) in float64, per head."""
    t = x.double().view(x.shape[0], -1, dim)
    c, s = cos.double()[:, None], sin.double()[:, None]
    half = torch.cat([-t[..., dim // 2:], t[..., :dim // 2]], dim=-1)
    return ((t * c + half * s).view(x.shape), ((t * c).abs() + (half * s).abs()).view(x.shape))


def check_rope(lib, tokens: int, dim: int) -> None:
    g = _gen(tokens * 1000 + dim)
    q = torch.randn(tokens, 9 * dim, generator=g)
    k = torch.randn(tokens, 3 * dim, generator=g)
    angle = torch.rand(tokens, dim // 2, generator=g) * 100
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    got_q, got_k = row_ops.rope_kernel(q, k, cos, sin, dim, lib)
    for got, x in ((got_q, q), (got_k, k)):
        ref, mag = _rotate64(x, cos, sin, dim)
        assert ((got.double() - ref).abs() <= 3 * U * mag + 1e-30).all()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm_matches_float64(rows, n):
    check_rms_norm(row_ops.kernel(), rows, n)
    check_rms_norm(row_ops.kernel(), rows, n, scale=0.003)   # where eps weighs


@pytest.mark.parametrize("dim", (64, 100, 576))
@pytest.mark.parametrize("tokens", ROWS)
def test_rope_matches_float64(tokens, dim):
    check_rope(row_ops.kernel(), tokens, dim)


def test_rope_and_the_residual_add_give_torchs_bits():
    """Both are products and sums torch rounds one op at a time (no fused multiply-add)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = _gen(3)
    q, k = torch.randn(1, 5, 9 * 64, generator=g), torch.randn(1, 5, 3 * 64, generator=g)
    cos, sin = torch.randn(1, 5, 64, generator=g), torch.randn(1, 5, 64, generator=g)
    want = apply_rotary_pos_emb(q.view(1, 5, 9, 64).transpose(1, 2),
                                k.view(1, 5, 3, 64).transpose(1, 2), cos, sin)
    got = row_ops.rope_kernel(q, k, cos, sin, 64)
    for w, x, heads in zip(want, got, (9, 3)):
        assert torch.equal(x.view(1, 5, heads, 64).transpose(1, 2), w)
    x, res, w = torch.randn(3, 576, generator=g), torch.randn(3, 576, generator=g), torch.randn(576)
    total, out = row_ops.add_rms_norm_kernel(x, res, w, 1e-5)
    assert torch.equal(total, res + x)
    assert torch.equal(out, row_ops.rms_norm_kernel(res + x, w, 1e-5))


def test_a_rows_bits_do_not_depend_on_the_calls_other_rows():
    g = _gen(4)
    x, w = torch.randn(33, 100, generator=g), torch.randn(100, generator=g)
    whole = row_ops.rms_norm_kernel(x, w, 1e-6)
    q, k = torch.randn(33, 200, generator=g), torch.randn(33, 100, generator=g)
    cos, sin = torch.randn(33, 100, generator=g), torch.randn(33, 100, generator=g)
    rotated = row_ops.rope_kernel(q, k, cos, sin, 100)
    for i in (0, 7, 32):
        assert torch.equal(row_ops.rms_norm_kernel(x[i:i + 1], w, 1e-6), whole[i:i + 1])
        one = row_ops.rope_kernel(q[i:i + 1], k[i:i + 1], cos[i:i + 1], sin[i:i + 1], 100)
        assert all(torch.equal(a, b[i:i + 1]) for a, b in zip(one, rotated))


def test_strided_rows_read_as_contiguous_ones():
    """The fused siblings' columns can arrive as views of one wider product."""
    g = _gen(5)
    wide = torch.randn(4, 300, generator=g)
    x, res, w = wide[:, :100], wide[:, 100:200], torch.randn(100, generator=g)
    got = row_ops.add_rms_norm_kernel(x, res, w, 1e-5)
    want = row_ops.add_rms_norm_kernel(x.contiguous(), res.contiguous(), w, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    cos, sin = torch.randn(4, 50, generator=g), torch.randn(4, 50, generator=g)
    got = row_ops.rope_kernel(wide[:, :100], wide[:, 200:250], cos, sin, 50)
    want = row_ops.rope_kernel(wide[:, :100].contiguous(), wide[:, 200:250].contiguous(), cos,
                               sin, 50)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_wrong_shapes_and_dtypes_are_refused():
    x = torch.randn(2, 64)
    with pytest.raises(ValueError):
        row_ops.rms_norm_kernel(x, torch.ones(63), 1e-5)
    with pytest.raises(TypeError):
        row_ops.rms_norm_kernel(x.double(), torch.ones(64), 1e-5)
    with pytest.raises(ValueError):
        row_ops.rope_kernel(x, torch.randn(2, 60), torch.ones(2, 64), torch.ones(2, 64), 64)
    with pytest.raises(ValueError):
        row_ops.add_rms_norm_kernel(x, torch.randn(2, 65), torch.ones(64), 1e-5)


MUTANTS = {
    "no eps": ("/ (float)n + eps", "/ (float)n", check_rms_norm, (3, 64, 0.003)),
    "rotary sign": ("(-x[d + h]) * s[d]", "x[d + h] * s[d]", check_rope, (2, 64)),
    "rotary halves": ("x[d - h] * s[d]", "x[d] * s[d]", check_rope, (2, 64)),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_checks_catch_a_mutant_kernel(name, tmp_path):
    old, new, check, args = MUTANTS[name]
    text = row_ops.SOURCE.read_text()
    assert old in text
    mutant = tmp_path / "row_ops.c"
    mutant.write_text(text.replace(old, new))
    lib = row_ops.load(mutant)
    assert lib is not None
    with pytest.raises(AssertionError):
        check(lib, *args)
