"""The panel linear layers (worker/linear/panels.py, docs/design/cpu-paths.md "Panel linear layers"): F.linear's
results up to fp32 rounding, every row bit for bit the same whatever the call's other rows
and thread count, taken where the output count fits the panels and nowhere else, and a
runner on them generating what the dense one does."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.linear import dispatch, packed, panels
from tests.worker.test_packed import assert_generates_alike
from worker.load import make_runner

pytestmark = pytest.mark.skipif(panels.kernel() is None, reason="panel kernel unavailable: no C compiler or no AVX-512")


def layer(out: int, k: int, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(out * 1000 + k)
    w = torch.randn(out, k, generator=g) / k ** 0.5
    return w, (torch.randn(out, generator=g) if bias else None)


@pytest.mark.parametrize("shape", [(0, 40), (1, 40), (3, 40), (13, 40), (37, 40), (2, 5, 40),
                                   (1, 1), (300, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_panel_linear_equals_f_linear(shape, bias):
    w, b = layer(96, shape[-1], bias)
    x = torch.randn(*shape)
    got = dispatch.linear(x, packed.pack_weight(w), b)
    want = F.linear(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_rows_result_does_not_depend_on_the_call():
    w, b = layer(64, 200)
    pw = panels.pack(w)
    x = torch.randn(300, 200)
    alone = torch.cat([panels.linear(x[i:i + 1], pw, b) for i in range(len(x))])
    for m in (2, 3, 5, 11, 12, 13, 25, 64, 300):
        assert torch.equal(panels.linear(x[:m], pw, b), alone[:m]), m
    assert torch.equal(panels.linear(x[7:19], pw, b), alone[7:19])


def test_the_thread_count_does_not_change_a_bit():
    w, b = layer(128, 96)
    pw, x = panels.pack(w), torch.randn(40, 96)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = panels.linear(x, pw, b)
        torch.set_num_threads(2)
        two = panels.linear(x, pw, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_panels_where_the_outputs_fit_onednn_elsewhere():
    fits, odd = layer(64, 16)[0], layer(40, 16)[0]
    assert panels.is_panels(packed.pack_weight(fits))
    assert packed.pack_weight(odd).layout == torch._mkldnn
    assert not panels.fits(fits.double()) and not panels.fits(fits[:, None])


def test_a_wrong_input_dtype_is_refused_not_misread():
    pw = panels.pack(layer(32, 8)[0])
    with pytest.raises(TypeError, match="float64"):
        panels.linear(torch.randn(2, 8, dtype=torch.float64), pw, None)


@pytest.fixture(scope="module")
def runners():
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TL_PANELS", "0")
        panels.kernel.cache_clear()
        onednn = make_runner("tiny", num_blocks=32, batch_invariant=True)
    finally:
        mp.undo()
        panels.kernel.cache_clear()
    return onednn, make_runner("tiny", num_blocks=32, batch_invariant=True)


def test_the_runner_takes_panels_for_the_layers_that_fit(runners):
    onednn, fast = runners
    weights = [m.weight for m in fast.model.modules() if isinstance(m, nn.Linear)]
    assert any(panels.is_panels(w) for w in weights)
    assert not any(panels.is_panels(m.weight) for m in onednn.model.modules()
                   if isinstance(m, nn.Linear))
    assert "tl::panel_linear" in str(fast.graph.fn.graph)


@pytest.mark.parametrize("prompt", [[1, 2, 3], list(range(10, 60))])
def test_a_panel_runner_generates_what_the_onednn_one_does(runners, prompt):
    assert_generates_alike(*runners, prompt)
