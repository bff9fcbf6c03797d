"""Steps through one recording of the model's forward (docs/design/cpu-paths.md, "The decode graph").

A step of smol runs ~2,600 torch calls from transformers' Python, and the Python between them
costs 6-8 ms a step whatever the batch: a fifth of a one-row decode. `torch.jit.trace`
records the calls of one forward once, at load; TorchScript's interpreter then replays them
from C++ at about a microsecond each, for every step whose tokens are all rows of the C
decode kernel (every step in the batch-invariant mode; pure-decode steps otherwise).

What varies between steps is only shapes. The calls whose Python depends on a shape (the
matmuls' row padding, the C kernels behind ctypes) are recorded as the ops
`tl::packed_linear`, `tl::panel_linear`, `tl::row_linear`, `tl::quant_linear`,
`tl::quant_embedding`, `tl::paged_decode` and `tl::kv_write`, and the row ops of
worker/row_ops.py (`tl::rms_norm`, `tl::add_rms_norm`, `tl::rope`), whose kernels are the
functions the eager forward calls. That the rest holds for a checkpoint's code is checked,
not assumed: `capture` refuses a model whose code decides on a tensor in Python, and keeps
the recording only if it answers a one-row and a five-row step bit for bit as the eager
forward does; anything else leaves the runner eager, with one line on
stderr saying why.
"""
from __future__ import annotations

import os
import sys
import warnings
from functools import cache

import torch

from worker.attention import KWARG, NativeDecode, PagedStep
from worker.handmade import Part, make_batch

PROBE_ROWS = (1, 5)   # 5 crosses the packed matmul's padding to 4 rows


def enabled() -> bool:
    return os.environ.get("TL_GRAPH", "1") != "0"


@cache
def ops() -> torch.library.Library:
    """`tl::packed_linear`, `tl::panel_linear`, `tl::row_linear`, `tl::quant_linear`,
    `tl::quant_embedding`, `tl::paged_decode`, `tl::kv_write` and the row ops, registered once
    per process (the Library must stay alive for them to stay registered: the cache holds
    it). The hottest have C++ kernels where those build (worker/torch_ops.py), the others
    (and those, elsewhere) the Python functions the eager forward calls."""
    from worker import native, row_ops, torch_ops
    from worker.linear import dispatch, panels, quant_module

    lib = torch.library.Library("tl", "DEF")
    for schema in SCHEMAS:
        lib.define(schema)
    cxx = torch_ops.OPS if torch_ops.register() else ()
    kernels = {"packed_linear": dispatch.packed_linear, "panel_linear": panels.panel_linear,
               "row_linear": dispatch.padded_linear, "quant_linear": quant_module.quant_linear,
               "quant_embedding": quant_module.quant_embedding,
               "paged_decode": native.kernel_decode, "kv_write": native.kernel_kv_write,
               "rms_norm": row_ops.rms_norm_kernel, "add_rms_norm": row_ops.add_rms_norm_kernel,
               "rope": row_ops.rope_kernel}
    for name, fn in kernels.items():
        if name not in cxx:
            lib.impl(name, fn, "CompositeExplicitAutograd")
    return lib


SCHEMAS = (
    "packed_linear(Tensor x, Tensor w, Tensor? b) -> Tensor",
    "panel_linear(Tensor x, Tensor w, Tensor? b) -> Tensor",
    "row_linear(Tensor x, Tensor w, Tensor? b, int tile) -> Tensor",
    "quant_linear(Tensor x, Tensor blocks, Tensor? b, int qtype) -> Tensor",
    "quant_embedding(Tensor ids, Tensor blocks, int qtype, int dim) -> Tensor",
    "paged_decode(Tensor q, Tensor k, Tensor v, Tensor tables, Tensor ctx, float scale) -> Tensor",
    "kv_write(Tensor(a!) cache, Tensor slots, Tensor k, Tensor v) -> ()",
    "rms_norm(Tensor x, Tensor w, float eps) -> Tensor",
    "add_rms_norm(Tensor x, Tensor residual, Tensor w, float eps) -> (Tensor, Tensor)",
    "rope(Tensor q, Tensor k, Tensor cos, Tensor sin, int dim) -> (Tensor, Tensor)",
)


class DecodeGraph:
    """The recorded forward: step tensors in, [sampled rows, vocab] logits out."""

    def __init__(self, fn, kv: torch.Tensor, weights: list[torch.Tensor]):
        self.fn = fn
        self.kv = kv
        self.weights = weights

    @staticmethod
    def takes(s) -> bool:
        """Every token of the step is a row of the C kernel (as the recording's were)."""
        return s.paged.native is not None and s.paged.num_decode == s.input_ids.shape[1]

    def __call__(self, s) -> torch.Tensor:
        nat = s.paged.native
        return self.fn(self.kv, s.input_ids, s.positions, s.keep, s.paged.slot_mapping,
                       nat.tables, nat.context, *self.weights)


def capture(runner, weights: list[torch.Tensor]) -> DecodeGraph | None:
    """The runner's decode graph, or None (with the reason on stderr) where the recording
    cannot be made or does not answer exactly as the eager forward does. `weights`: the
    packed weights (a graph cannot hold oneDNN's tensors as constants: they are inputs)."""
    if not enabled():
        return None
    try:
        with torch.inference_mode():
            return _checked(runner, weights)
    except Exception as e:  # noqa: BLE001 - any failure leaves the eager forward, said once
        print(f"[worker] decode graph unavailable, running eager: {e}", file=sys.stderr,
              flush=True)
        return None


def _checked(runner, weights: list[torch.Tensor]) -> DecodeGraph:
    probes = [_probe_step(runner, n) for n in PROBE_ROWS]
    graph = _trace(runner, weights, probes[0])
    for n, s in zip(PROBE_ROWS, probes):
        if not torch.equal(graph(s), runner.eager_logits(s)):
            raise ValueError(f"its logits differ from the eager forward's at {n} rows")
    return graph


def _trace(runner, weights: list[torch.Tensor], s) -> DecodeGraph:
    """The recording of the forward over probe step `s`."""
    ops()
    model = runner.model
    model.requires_grad_(False)   # the dense weights become the graph's constants

    def forward(kv, input_ids, positions, keep, slots, tables, ctx, *_weights):
        paged = PagedStep(kv=kv, slot_mapping=slots, num_decode=input_ids.shape[1],
                          decode_groups=[], spans=[], native=NativeDecode(tables, ctx))
        return model(input_ids=input_ids, position_ids=positions, use_cache=False,
                     logits_to_keep=keep, **{KWARG: paged}).logits[0]

    example = (runner.kv, s.input_ids, s.positions, s.keep, s.paged.slot_mapping,
               s.paged.native.tables, s.paged.native.context, *weights)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn = torch.jit.trace(forward, example, check_trace=False)
    _refuse_decisions(seen)
    return DecodeGraph(fn, runner.kv, weights)


# where the recorder's warnings are on shapes every step shares (see _refuse_decisions)
OWN = (os.path.dirname(__file__), os.path.join(os.path.dirname(torch.__file__), "nn",
                                               "functional.py"))


def _refuse_decisions(seen) -> None:
    """The recorder warns where Python turns a tensor into a bool, int or loop (a branch
    the recording freezes). Ours (the attention's decode-only test) and torch.nn.functional's
    (the embedding's padding-index check) are on shapes every step shares; one in the
    model's code may be on values (an MoE's routing), so that model stays eager."""
    for w in seen:
        if issubclass(w.category, torch.jit.TracerWarning) and not w.filename.startswith(OWN):
            raise ValueError(f"its code decides on a tensor at {w.filename}:{w.lineno}, "
                             "which a recording would freeze")


def _probe_step(runner, rows: int):
    """`rows` one-token sequences at positions 0..rows-1 of the pool's first blocks: row i
    writes slot i and reads slots 0..i. Harmless at load: no request holds a block yet."""
    from worker.step import build_step

    bs = runner.info.block_size
    rows = min(rows, runner.info.num_blocks * bs)
    table = list(range(-(-rows // bs)))
    batch = make_batch([Part([1] * (i + 1), i, 1, table) for i in range(rows)], bs)
    s = build_step(batch, runner.kv, runner.native, runner.windows, runner.per_row)
    if not DecodeGraph.takes(s):
        raise ValueError("the probe step does not take the C decode kernel")
    return s
