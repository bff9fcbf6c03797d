"""K-quant (and Q5) tensors re-quantized to Q8_0 at load (worker/requantize.py): the weights
gguf-py decodes from the file's blocks, each within half a Q8_0 step of its 32-weight block;
the warning names the types and what they cost."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.linear.quant import Q8_0, dequantize
from worker.requantize import decoded, requantizable, to_q8_0, warning

# bytes per 256-weight block and where its fp16 scales sit (ggml's layouts)
LAYOUTS = {"Q6_K": (210, (208,)), "Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)),
           "Q3_K": (110, (108,)), "Q2_K": (84, (80, 82))}


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes for every field, the fp16 scales set to small normal values."""
    size, scales = LAYOUTS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for at in scales:
        raw[..., at:at + 2] = (rng.uniform(1e-3, 4e-3, raw.shape[:2]).astype(np.float16)
                               .view(np.uint8).reshape(*raw.shape[:2], 2))
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(LAYOUTS))
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
    assert all(requantizable(t) for t in ("Q4_K", "Q6_K", "Q5_0", "Q5_1", "Q2_K"))
    assert not any(requantizable(t) for t in ("Q8_0", "Q4_0", "Q4_1", "F32", "IQ4_NL"))


def test_the_warning_names_each_type_and_its_cost():
    line = warning("m.gguf", {"Q6_K", "Q4_K"})
    assert "Q4_K (1.9x its bytes), Q6_K (1.3x its bytes)" in line
    assert "re-quantized to Q8_0" in line and "--dequantize" in line
