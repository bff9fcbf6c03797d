"""Q2_K and Q3_K tensors re-quantized to Q8_0 at load (worker/requantize.py): the weights
gguf-py decodes from the file's blocks, each within half a Q8_0 step of its 32-weight block;
the warning names the types and what they cost."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.worker.test_kquant_kernels import random_blocks
from worker.linear.quant import Q8_0, dequantize
from worker.requantize import decoded, requantizable, to_q8_0, warning

@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "Q4_K", "Q6_K"])
def test_each_weight_is_within_half_a_q8_0_step(type_name):
    floats = decoded(random_blocks(type_name, 5, 512), type_name)
    assert floats.shape == (5, 512) and np.isfinite(floats).all()
    qw = to_q8_0(floats)
    assert qw.qtype is Q8_0 and qw.shape == (5, 512)
    got = dequantize(qw, torch.float64).numpy()
    blocks = np.abs(floats.astype(np.float64)).reshape(5, 16, 32).max(-1, keepdims=True)
    step = blocks / 127   # Q8_0's d, before it is stored as fp16
    err = np.abs(got - floats).reshape(5, 16, 32)
    # rounding to the step, then the step's own fp16 rounding (2^-11 relative) times |q| <= 127
    assert (err <= step * (0.5 + 127 * 2.0 ** -11) + 1e-12).all(), (err / step).max()
    assert (err > 0).any()   # re-quantized, not the file's weights bit for bit


def test_only_the_types_without_a_kernel_are_requantized():
    assert all(requantizable(t) for t in ("Q2_K", "Q3_K"))
    native = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
    assert not any(requantizable(t) for t in (*native, "F32", "IQ4_NL"))


def test_the_warning_names_each_type_and_its_cost():
    line = warning("m.gguf", {"Q3_K", "Q2_K"})
    assert "Q2_K (3.2x its bytes), Q3_K (2.5x its bytes)" in line
    assert "re-quantized to Q8_0" in line and "--dequantize" in line
