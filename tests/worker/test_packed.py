"""Packed linear layers (docs/design/cpu-paths.md, "Packed linear layers"): oneDNN's packed matmul
gives F.linear's results, the layers that share an input are found by tracing and fused, a
fused member handed another tensor still answers exactly, and a packed runner generates
what the dense one does."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.linear import dispatch, packed
from worker.handmade import generate_alone
from worker.load import make_runner

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="torch built without oneDNN")


@pytest.mark.parametrize("shape", [(0, 40), (1, 40), (3, 40), (4, 40), (37, 40), (2, 5, 40)])
def test_packed_linear_equals_dense(shape):
    layer = nn.Linear(40, 96)
    w, b = layer.weight.detach(), layer.bias.detach()
    x = torch.randn(*shape)
    got = dispatch.linear(x, packed.pack_weight(w), b)
    assert got.shape == F.linear(x, w, b).shape
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


class Block(nn.Module):
    """q, k, v read one tensor; o reads another; `twice` is called two times."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(8, n) for n in (8, 4, 4, 8))
        self.twice = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        h = self.q(x) + torch.cat([self.k(x), self.v(x)], -1)
        return self.twice(self.twice(self.o(h)))


def test_siblings_are_traced_not_assumed():
    block = Block()
    groups = packed.siblings(block, lambda: block(torch.randn(3, 8)))
    assert groups == [[block.q, block.k, block.v], [block.o], [block.twice]]


def test_fused_block_answers_like_the_dense_one_whatever_it_is_handed():
    torch.manual_seed(0)
    block = Block()
    x, y = torch.randn(5, 8), torch.randn(5, 8)
    dense = [m(t).detach() for m, t in ((block.q, x), (block.k, y), (block.v, x))]
    want = block(x).detach()
    packed.pack(block, packed.siblings(block, lambda: block(x)))
    assert dispatch.is_packed(block.o.weight) and block.q.weight.numel() == 0
    torch.testing.assert_close(block(x), want, atol=1e-5, rtol=1e-5)
    # k handed another tensor than q and v: the product is recomputed for it
    got = [block.q(x), block.k(y), block.v(x)]
    for g, d in zip(got, dense):
        torch.testing.assert_close(g, d, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def runners():
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TL_PACKED", "0")
        dense = make_runner("tiny", num_blocks=32, batch_invariant=False)
    finally:
        mp.undo()
    return dense, make_runner("tiny", num_blocks=32, batch_invariant=False)


def test_runner_packs_every_linear_and_keeps_the_embedding(runners):
    dense, fast = runners
    linears = [m for m in fast.model.modules() if isinstance(m, nn.Linear)]
    assert linears and not any(isinstance(m.weight, nn.Parameter) for m in linears)
    assert not any(dispatch.is_packed(m.weight) for m in dense.model.modules()
                   if isinstance(m, nn.Linear))
    assert isinstance(fast.model.get_input_embeddings().weight, nn.Parameter)


def file_maps() -> list[tuple[int, int]]:
    """The address ranges of the checkpoint files mapped into this process."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[5].endswith(".safetensors"):
                lo, hi = (int(a, 16) for a in fields[0].split("-"))
                spans.append((lo, hi))
    return spans


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc here")
def test_packed_runner_keeps_nothing_in_the_checkpoint_map(runners):
    """Its embedding and norms live in memory of their own, so the map of the file, which
    holds the float weights the packing replaced, is not kept resident (packed.own_the_rest).
    The dense runner's weights are the control: they are views of the map."""
    dense, fast = runners
    spans = file_maps()

    def mapped(model) -> list[str]:
        return [name for name, p in model.named_parameters()
                if any(lo <= p.data_ptr() < hi for lo, hi in spans)]
    assert mapped(dense.model), "the control: transformers no longer maps the checkpoint"
    assert mapped(fast.model) == []


def assert_generates_alike(reference, runner, prompt: list[int]) -> None:
    """12 greedy tokens the same, logits within fp32 rounding."""
    table = list(range(8))
    want, want_logits = generate_alone(reference, prompt, 12, table, collect_logits=True)
    got, got_logits = generate_alone(runner, prompt, 12, table, collect_logits=True)
    assert got == want
    for g, w in zip(got_logits, want_logits):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt", [[1, 2, 3], list(range(10, 60)), [7] * 33])
def test_packed_runner_generates_what_the_dense_one_does(runners, prompt):
    assert_generates_alike(*runners, prompt)
