"""The C++ kernels of the decode graph's hottest ops (worker/torch_ops.py, csrc/torch_ops.cpp):
registered where the compilers are, and bit for bit what the Python kernels give on the same
arguments (contiguous or not, with and without bias or residual, broadcast tables), with the
same refusals."""
from __future__ import annotations

import pytest
import torch

from worker import row_ops, torch_ops
from worker.graph import ops
from worker.linear import quant
from worker.linear.quant_module import quant_linear
from worker.linear.quantize import quantize


@pytest.fixture(scope="module")
def cxx():
    ops()
    if not torch_ops.enabled():
        pytest.skip("TL_NATIVE=0 or TL_TORCH_OPS=0: the graph's ops keep their Python kernels")
    if torch_ops.compiler() is None or quant.kernel() is None:
        pytest.skip("no C or C++ compiler: the graph's ops keep their Python kernels")
    # with both compilers the C++ kernels must have built and registered
    assert "torch_ops.cpp" in torch._C._dispatch_dump("tl::quant_linear")
    return torch.ops.tl


def test_every_listed_op_has_the_cpp_kernel(cxx):
    for name in torch_ops.OPS:
        assert "torch_ops.cpp" in torch._C._dispatch_dump(f"tl::{name}"), name
    assert "torch_ops.cpp" not in torch._C._dispatch_dump("tl::quant_embedding")


@pytest.mark.parametrize("qtype", [quant.Q8_0, quant.Q4_0, quant.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (2, 3, 96), (0, 96)])
def test_quant_linear_equals_the_python_kernel(cxx, qtype, shape):
    qw = quantize(torch.randn(37, 96), qtype)
    x, b = torch.randn(shape), torch.randn(37)
    for bias in (None, b):
        want = quant_linear(x, qw.data, bias, qtype.ggml_id)
        assert torch.equal(cxx.quant_linear(x, qw.data, bias, qtype.ggml_id), want)
    t = torch.randn(96, 4).T   # not contiguous
    assert torch.equal(cxx.quant_linear(t, qw.data, None, qtype.ggml_id),
                       quant_linear(t, qw.data, None, qtype.ggml_id))


@pytest.mark.parametrize("qtype", [quant.Q5_0, quant.Q5_1, quant.Q4_K, quant.Q5_K, quant.Q6_K],
                         ids=lambda t: t.name)
def test_quant_linear_takes_the_k_quants_and_q5(cxx, qtype):
    from tests.worker.test_kquant_kernels import weight
    qw, b = weight(qtype, 37, 512), torch.randn(37)
    for x in (torch.randn(1, 512), torch.randn(2, 9, 512)):
        assert torch.equal(cxx.quant_linear(x, qw.data, b, qtype.ggml_id),
                           quant_linear(x, qw.data, b, qtype.ggml_id))
    if qtype.block == 256:   # rows of part of a super-block: refused by the C kernel
        with pytest.raises(RuntimeError, match="refused type"):
            cxx.quant_linear(torch.randn(2, 160), qw.data[:, :qtype.block_bytes].contiguous(), None,
                             qtype.ggml_id)


def test_row_ops_equal_the_python_kernels(cxx):
    x, r, w = torch.randn(3, 5, 64), torch.randn(3, 5, 64), torch.randn(64)
    for a in (x, x.transpose(0, 1)):
        assert torch.equal(cxx.rms_norm(a, w, 1e-5), row_ops.rms_norm_kernel(a, w, 1e-5))
    got, want = cxx.add_rms_norm(x, r, w, 1e-6), row_ops.add_rms_norm_kernel(x, r, w, 1e-6)
    assert all(torch.equal(g, h) for g, h in zip(got, want))
    q, k = torch.randn(2, 7, 9 * 64), torch.randn(2, 7, 3 * 64)
    cos, sin = torch.randn(2, 7, 64), torch.randn(2, 7, 64)
    for c, s in ((cos, sin), (cos[:1], sin[:1])):   # broadcast over the batch
        got, want = cxx.rope(q, k, c, s, 64), row_ops.rope_kernel(q, k, c, s, 64)
        assert all(torch.equal(g, h) for g, h in zip(got, want))


def test_the_same_refusals(cxx):
    qw = quantize(torch.randn(4, 64), quant.Q4_1)
    with pytest.raises(RuntimeError, match="float32"):
        cxx.quant_linear(torch.randn(2, 64, dtype=torch.float64), qw.data, None, 3)
    with pytest.raises(RuntimeError, match="RMSNorm weight"):
        cxx.rms_norm(torch.randn(2, 64), torch.randn(32), 1e-5)
    with pytest.raises(RuntimeError, match="residual"):
        cxx.add_rms_norm(torch.randn(2, 64), torch.randn(3, 64), torch.randn(64), 1e-5)
    with pytest.raises(RuntimeError, match="rotary"):
        cxx.rope(torch.randn(2, 96), torch.randn(2, 64), torch.randn(2, 64), torch.randn(2, 64), 64)


def test_off_with_tl_torch_ops_0(monkeypatch):
    monkeypatch.setenv("TL_TORCH_OPS", "0")
    assert not torch_ops.enabled() and not torch_ops.register()


def test_attention_ops_equal_the_python_kernels(cxx):
    from worker import native
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(2, 12, 16, 3, 64, generator=g)          # [2, blocks, B, KVH, D]
    q = torch.randn(4, 9, 64, generator=g)
    tables = torch.tensor([[0, 3, 5], [1, 2, 0], [4, 0, 0], [6, 7, 8]])
    ctx = torch.tensor([40, 20, 3, 48])
    want = native.kernel_decode(q, pool[0], pool[1], tables, ctx, 0.125)
    assert torch.equal(cxx.paged_decode(q, pool[0], pool[1], tables, ctx, 0.125), want)
    k, v = torch.randn(3, 5, 64, generator=g), torch.randn(5, 3, 64, generator=g).transpose(0, 1)
    slots = torch.tensor([0, 17, 33, 190, 5])
    a, b = pool.clone(), pool.clone()
    native.kernel_kv_write(a, slots, k, v)
    cxx.kv_write(b, slots, k, v)
    assert torch.equal(a, b) and not torch.equal(a, pool)
    with pytest.raises(RuntimeError, match="outside the KV pool"):
        cxx.kv_write(b, torch.tensor([0, 1, 2, 3, 12 * 16]), k, v)
    assert torch.equal(a, b)   # nothing written
    with pytest.raises(RuntimeError, match="for a pool of"):
        cxx.kv_write(b, slots, k[:, :4], v)
