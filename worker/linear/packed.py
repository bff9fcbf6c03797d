"""Linear layers on packed weights (CPU, float32, one worker process), with the linear
layers that read the same input multiplied as one (docs/design/cpu-paths.md, "Packed linear layers").
A weight is packed in panels for the C kernel where it takes it (worker/linear/panels.py),
else in oneDNN's blocked layout; worker/linear/dispatch.py multiplies by either.

torch's F.linear on the CPU calls MKL, which for the few rows of a decode step runs one
thread at about 11 GB/s of weights here. oneDNN's matmul on a weight reordered once into its
blocked layout runs every thread, and runs faster still on one wide weight than on several
narrow ones: smol's 30 layers at one row take 25 ms as 7 matmuls a layer, 15 ms as 4 (q, k
and v as one; gate and up as one) with the rows padded to 4, against 48 ms through MKL.

Which layers share an input is traced, not assumed: `siblings` runs one forward and groups
the consecutive calls that received the very same tensor. At serving time a group's first
member computes the whole product and its siblings take their columns, but only when they
are handed that same tensor object; any other input recomputes the product for it. So a
model whose code path differs from the traced one still gets exact answers.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from worker.linear import panels
from worker.linear.dispatch import linear

ROWS_HINT = 64   # the row count oneDNN lays the weight out for; measured best from 1 to 1024

Matmul = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def enabled() -> bool:
    return os.environ.get("TL_PACKED", "1") != "0"


def usable(model, tp: int) -> bool:
    """CPU float32 with oneDNN, one worker process (a tensor-parallel shard's linear layers
    belong to transformers' plan), and TL_PACKED not 0."""
    if not enabled() or tp != 1 or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """In panels for the C kernel where it takes the weight, else in oneDNN's layout."""
    if panels.fits(weight):
        return panels.pack(weight)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ROWS_HINT)


def siblings(model, forward: Callable[[], object], kind: type = nn.Linear,
             alike: Callable[[nn.Module, nn.Module], bool] | None = None) -> list[list]:
    """The model's linear layers (modules of `kind`) in groups that read one tensor, as one
    `forward` calls them; a layer called more than once there stands alone. `alike`: which
    may be one weight (default: nn.Linear's input size, dtype and bias)."""
    alike = alike or _alike
    calls: list[tuple[nn.Module, torch.Tensor]] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: calls.append((mod, args[0])))
             for m in model.modules() if isinstance(m, kind)]
    try:
        forward()
    finally:
        for h in hooks:
            h.remove()
    count = Counter(id(m) for m, _ in calls)
    groups: list[list[nn.Linear]] = []
    prev = None
    for mod, x in calls:
        last = groups[-1] if groups else None
        if (last and prev is x and count[id(mod)] == count[id(last[0])] == 1
                and alike(last[0], mod)):
            last.append(mod)
        elif count[id(mod)] == 1 or all(g[0] is not mod for g in groups):
            groups.append([mod])
        prev = x
    return groups


def _alike(a: nn.Linear, b: nn.Linear) -> bool:
    return (a.in_features == b.in_features and a.weight.dtype == b.weight.dtype
            and (a.bias is None) == (b.bias is None))


class Columns:
    """Sibling layers multiplied as one weight: member i's forward is `take(i, x)`, its
    columns of `product(x)`; the product is made once per input and dropped when every
    member has taken its part (quant_fuse.py's quantized siblings share this)."""

    def __init__(self, widths: list[int]):
        self.widths = widths
        self.x: torch.Tensor | None = None
        self.outs: list[torch.Tensor | None] = []

    def product(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def take(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if self.x is not x or self.outs[i] is None:
            self.outs = [t.contiguous() for t in self.product(x).split(self.widths, dim=-1)]
            self.x = x
        out, self.outs[i] = self.outs[i], None
        if all(o is None for o in self.outs):
            self.x = None   # every member has its columns: hold nothing between steps
        return out


class Fused(Columns):
    """Linear layers that read one input, as one packed weight."""

    def __init__(self, mods: list[nn.Linear], plan: Callable[..., Matmul]):
        super().__init__([m.out_features for m in mods])
        self.weight = pack_weight(torch.cat([m.weight.detach() for m in mods]))
        self.bias = None if mods[0].bias is None else torch.cat([m.bias.detach() for m in mods])
        self.matmul = plan(self.weight, self.bias)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.weight, self.bias)


def dense_plan(weight: torch.Tensor, bias) -> Matmul:
    return linear


def pack(model, groups: list[list[nn.Linear]],
         plan: Callable[..., Matmul] = dense_plan) -> list[torch.Tensor]:
    """Pack every nn.Linear of `model` in place, each group of `groups` as one weight;
    `plan(packed weight, bias)` gives the function that multiplies by it (the batch-invariant
    mode's row padding, worker/linear/rows.py), asked once per weight shape. Returns the packed
    weights (a fused group's lives in no module: worker/graph.py needs them all)."""
    plans: dict[tuple, Matmul] = {}

    def plan_once(weight: torch.Tensor, bias) -> Matmul:
        key = (tuple(weight.shape), bias is None)
        if key not in plans:
            plans[key] = plan(weight, bias)
        return plans[key]

    grouped = {id(m) for g in groups for m in g}
    singles = [[m] for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in grouped]
    weights = []
    for group in [*groups, *singles]:
        if len(group) == 1:
            weights.append(_pack_one(group[0], plan_once))
        else:
            fused = Fused(group, plan_once)
            weights.append(fused.weight)
            for i, mod in enumerate(group):
                _swap(mod, None, lambda x, i=i, f=fused: f.take(i, x))
    own_the_rest(model)
    return weights


def own_the_rest(model) -> None:
    """Copy the weights the packing left dense (embeddings, norms, biases) into memory of
    their own. transformers maps a safetensors checkpoint into memory and its tensors are
    views of that one map: while one of them lives, every page of the file the load read stays
    resident, the float weights the packed copies replaced included (400 of smollm2's 513 MB).
    The same Parameter objects are kept, so tied weights stay tied."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()


def _pack_one(mod: nn.Linear, plan) -> torch.Tensor:
    weight = pack_weight(mod.weight)
    matmul = plan(weight, mod.bias)
    _swap(mod, weight, lambda x: matmul(x, mod.weight, mod.bias))
    return weight


def _swap(mod: nn.Linear, weight: torch.Tensor | None, forward) -> None:
    """Drop the dense Parameter (a tied module keeps its own reference) for `weight`: the
    packed copy, or, for a fused member, a placeholder with the dtype and device only."""
    dtype, device = mod.weight.dtype, mod.weight.device
    del mod.weight
    if weight is None:
        weight = torch.empty(0, dtype=dtype, device=device)
    mod.register_buffer("weight", weight, persistent=False)
    mod.forward = forward
