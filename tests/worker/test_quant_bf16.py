"""`--prefill-bf16` (docs/design/cpu-paths.md, "Prompts in bfloat16"): the quantized kernel's
bfloat16 path (worker/csrc/quant_bf16.h) on every block type, against the float64 product of
the bfloat16-rounded input and weights within float32's accumulation bound, a row's bits the
same in any batch and on 1 or 2 threads; a damaged scale fails it. Then the worker: which
calls take the path, what it refuses, what the step log records and replay re-runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from scripts.group.supervisor import parse
from tests.worker.test_kquant_kernels import cols_of, gguf_weights, weight
from tests.worker.test_quant_int8 import reruns_in_its_mode, same_bits_in_any_batch
from tests.worker.test_quant_kernels import U
from worker.linear import quant
from worker.linear.quant_module import QuantLinear
from worker.load import make_runner
from worker.quantized import PREFILL_BF16_ROWS, settings

pytestmark = pytest.mark.skipif(not quant.has_bf16(),
                                reason="the CPU has no AVX512_BF16: --prefill-bf16 is refused")


def to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Each value rounded to the nearest bfloat16 (ties to even), as float64."""
    return t.to(torch.bfloat16).double()


def within_bf16_bound(y: torch.Tensor, x: torch.Tensor, w: np.ndarray,
                      b: torch.Tensor | None) -> bool:
    """y against the float64 product of bfloat16(x) and bfloat16(w): one float32 sum a
    output, of k / 2 vdpbf16ps steps that each add two (exact) products, then the bias."""
    k = x.shape[1]
    xb, wb = to_bf16(x), to_bf16(torch.from_numpy(w))
    exact, scale = xb @ wb.T, xb.abs() @ wb.abs().T
    if b is not None:
        exact, scale = exact + b.double(), scale + b.double().abs()
    steps = k + 1
    gamma = steps * U / (1 - steps * U)
    return bool(((y.double() - exact).abs() <= gamma * scale).all())


@pytest.mark.parametrize("qtype", list(quant.TYPES.values()), ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 17, 33])
def test_outputs_within_the_bound_of_the_rounded_product(qtype, m):
    k = cols_of(qtype)
    qw, x, b = weight(qtype, 101, k, seed=m), torch.randn(m, k), torch.randn(101)
    y = quant.matmul(x, qw, b, bf16=True)
    w = gguf_weights(qw)
    assert within_bf16_bound(y, x, w, b)
    # and it is a rounded product: the float32 path's answer is not this one
    assert not torch.equal(y, quant.matmul(x, qw, b))


@pytest.mark.parametrize("qtype", [quant.Q4_K, quant.Q6_K, quant.Q4_0], ids=lambda t: t.name)
def test_a_damaged_scale_fails_the_bound(qtype):
    k = cols_of(qtype)
    qw, x = weight(qtype, 23, k), torch.randn(5, k)
    w = gguf_weights(qw)
    data = qw.data.numpy().copy()
    at = 208 if qtype is quant.Q6_K else 0   # the (super-)block's fp16 scale
    data[3, at + 1] ^= 0x04                   # an exponent bit of row 3's first scale
    broken = quant.QuantWeight(torch.from_numpy(data), qtype, qw.shape)
    assert not within_bf16_bound(quant.matmul(x, broken, bf16=True), x, w, None)


@pytest.mark.parametrize("qtype", [quant.Q4_K, quant.Q6_K, quant.Q8_0], ids=lambda t: t.name)
def test_a_rows_bits_do_not_depend_on_the_batch_or_threads(qtype):
    k = cols_of(qtype)
    qw, x, b = weight(qtype, 101, k), torch.randn(40, k), torch.randn(101)
    same_bits_in_any_batch(lambda rows: quant.matmul(rows, qw, b, bf16=True), x,
                           (1, 3, 4, 5, 17, 39))


@pytest.fixture(scope="module")
def runners():
    """`tiny` with its linear layers in Q4_0, in float32 and with --prefill-bf16."""
    args = dict(num_blocks=64, batch_invariant=False, quantize="q4_0")
    return make_runner("tiny", **args), make_runner("tiny", prefill_bf16=True, **args)


def test_wide_calls_take_the_path_and_narrow_ones_do_not(runners):
    plain, wide = runners
    layers = [m for m in wide.model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.bf16_rows == PREFILL_BF16_ROWS for m in layers)
    layer = next(m for m in layers if m.qweight is not None)
    x = torch.randn(PREFILL_BF16_ROWS, layer.in_features)
    exact = quant.matmul(x, layer.qweight, layer.bias)
    assert not torch.equal(layer(x), exact)                  # 16 rows: bfloat16
    assert torch.equal(layer(x[:-1]), exact[:-1])            # 15: float32, its bits
    assert torch.allclose(layer(x), exact, rtol=0.05, atol=0.05 * exact.abs().max().item())


def test_the_log_records_it_and_replay_asks_for_it(runners):
    plain, wide = runners
    assert "prefill" not in plain.info.quantization
    assert wide.info.quantization["prefill"] == {"dtype": "bfloat16", "rows": PREFILL_BF16_ROWS}
    assert settings({"quantization": wide.info.quantization}) == {"quantize": "q4_0",
                                                                  "prefill_bf16": True}
    assert not wide.info.batch_invariant


@pytest.mark.parametrize("kwargs,why", [
    (dict(quantize="q4_0", batch_invariant=True), "--batch-invariant"),
    (dict(), "these are float"),
])
def test_what_it_refuses(kwargs, why):
    with pytest.raises(ValueError, match=why):
        make_runner("tiny", num_blocks=8, prefill_bf16=True, **kwargs)


def test_serve_passes_it_to_the_worker():
    from scripts.group.commands import commands
    assert "--prefill-bf16" in commands(parse(["--prefill-bf16"]), "/tmp/x", None)["worker"]
    assert "--prefill-bf16" not in commands(parse([]), "/tmp/x", None)["worker"]


def test_serve_refuses_it_with_batch_invariance(capsys):
    with pytest.raises(SystemExit):
        parse(["--model", "tiny", "--prefill-bf16", "--batch-invariant"])
    assert "--prefill-bf16 and --batch-invariant" in capsys.readouterr().err


def test_the_engine_serves_on_it(runners):
    """A 40-token prompt (its step's calls take the path), then decode steps (they do not):
    the greedy tokens come, and agree with float32's where this random model's top two are
    far apart (here: all but near-ties)."""
    from tests.worker.test_worker_engine import GREEDY, run_engine
    plain, wide = runners
    prompt = list(range(100, 140))
    ours, _ = run_engine(wide, [(prompt, 8, GREEDY)])
    theirs, _ = run_engine(plain, [(prompt, 8, GREEDY)])
    assert len(ours[0]) == 8 and ours[0][0] == theirs[0][0], (ours, theirs)


def test_replay_reruns_its_log_in_it(runners, tmp_path, capsys):
    """The log's model_info says --prefill-bf16; the re-run takes it, so its prompt steps
    give the logged tokens."""
    reruns_in_its_mode(runners[1], str(tmp_path / "w.db"), "prefill", capsys)
