"""The batch-invariant mode (scripts/serve --batch-invariant): a row's logits do not depend
on the other rows of the step (docs/design/cpu-paths.md, "Batch-invariant mode").

Two things break it on the CPU, both fixed here through transformers' hooks, not model code:
- Linear layers: MKL picks its sgemm kernel by shape, so a row's result depends on how
  many rows share the call. Measured here: calls of 1, of 2-3 rows, and the rows past the
  last multiple of 4 in calls of 5-11 rows each round differently; every other row equals
  its result in a call of 4 rows. Each nn.Linear's forward is replaced by one that pads a
  call to a multiple of ROW_ALIGN rows (worker/linear/rows.py); where a load-time check finds a shape whose rows
  still vary, that layer runs in fixed tiles of TILE rows (every call the same shape); where
  even that varies the mode is refused.
- Attention: SDPA (prefill) and the C kernel (decode) reduce in different orders, and a
  chunked prefill splits the reduction. In this mode every query token, prefill tokens
  included, is a row of the C kernel (worker/step.py `per_row`): its keys in block order,
  one thread per (token, KV head), whatever the chunk or the batch.
RMSNorm, softmax, log_softmax, sort and cumsum over the last dim are already per-row
invariant in torch's CPU kernels (checked by tests/worker/test_invariant.py end to end).
"""
from __future__ import annotations

import torch
from torch import nn

from worker import archs, native



def check_supported(model, kv: torch.Tensor, rep: int, tp: int) -> None:
    """ValueError saying why the mode cannot run this model here."""
    cfg = model.config
    if tp != 1:
        raise ValueError("--batch-invariant runs with one worker process (--tp 1): the "
                         "all-reduces of tensor parallelism sum in a schedule of their own")
    if not archs.plain_attention(cfg):
        raise ValueError("--batch-invariant needs the C attention kernel, which has no "
                         "sliding window or softcap; this model uses one")
    if not native.usable(kv, rep, any_dim=True):
        raise ValueError("--batch-invariant needs the C attention kernel (CPU, float32, a "
                         f"head dim that is a multiple of 16 up to 128, at most 16 query "
                         f"heads per KV head); here: {kv.device.type}, {kv.dtype}, head dim "
                         f"{kv.shape[-1]}, {rep} per KV head, kernel "
                         f"{'built' if native.kernel() else 'unavailable'}")
    from worker.linear import quant
    from worker.linear.quant_module import QuantEmbedding, QuantLinear
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear) and quant.kernel() is None:
            raise ValueError("--batch-invariant needs the quantized kernel for quantized "
                             "weights (without it they go through MKL); pass --dequantize")
        if isinstance(mod, (nn.Linear, nn.Embedding, QuantLinear, QuantEmbedding)):
            continue
        weights = [n for n, p in mod.named_parameters(recurse=False) if p.dim() >= 2]
        if weights:
            raise ValueError(f"--batch-invariant covers nn.Linear layers only; {name} "
                             f"({type(mod).__name__}) multiplies by its own {weights[0]}")


def supported(model, kv: torch.Tensor, tp: int) -> bool:
    """Whether the mode can run this model here (the default, where it can: its cost was
    under 5% on the mixed workload, docs/design/cpu-paths.md "Batch-invariant mode")."""
    cfg = model.config
    rep = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None)
                                      or cfg.num_attention_heads)
    try:
        check_supported(model, kv, rep, tp)
    except ValueError:
        return False
    return True
