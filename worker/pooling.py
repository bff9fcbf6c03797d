"""Embeddings on the worker (docs/design/worker.md, "Embeddings"): the final hidden state of
each pooled row (the output of the model's last norm, the one the LM head reads),
L2-normalised. Last-token pooling, as vLLM does by default for a decoder model run as an
embedder and llama.cpp's `--pooling last`.

The state is read by a forward hook on that norm, so the forward itself is the one every
step runs (and, with --tp, every rank runs the same collectives); only the rank that
answers reads what the hook kept."""
from __future__ import annotations

import torch
from torch import nn

from core.ipc.protocol import F32, ForwardBatch


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm after the last decoder layer (Llama, Qwen, Mistral, Gemma: `model.norm`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return getattr(decoder, "norm", None)


class Pooler:
    """Keeps the final norm's output at the rows the step pools, between `arm` and `take`."""

    def __init__(self, model: nn.Module):
        self._rows: torch.Tensor | None = None
        self._kept: torch.Tensor | None = None
        norm = final_norm(model)
        self.usable = norm is not None
        if norm is not None:
            norm.register_forward_hook(self._hook)

    def arm(self, batch: ForwardBatch) -> bool:
        """Ready to keep batch.pool_rows (False: the batch pools nothing). ValueError for
        rows outside the step's tokens or a model without a final norm."""
        n = len(batch.pool_rows)
        self._kept = None
        if n == 0:
            self._rows = None
            return False
        if not self.usable:
            raise ValueError("this model has no final norm to pool: it cannot embed")
        rows = torch.frombuffer(batch.pool_rows, dtype=torch.int32).long()
        if int(rows.min()) < 0 or int(rows.max()) >= batch.num_tokens:
            raise ValueError("pool_rows point outside the step's tokens")
        self._rows = rows
        return True

    def _hook(self, module, args, output) -> None:
        if self._rows is not None:
            hidden = output[0] if isinstance(output, tuple) else output
            self._kept = hidden.reshape(-1, hidden.shape[-1])[self._rows.to(hidden.device)]

    def take(self) -> F32:
        """The kept rows, L2-normalised in float32, flattened in pool_rows order."""
        kept, self._kept, self._rows = self._kept, None, None
        if kept is None:
            return F32()
        v = torch.nn.functional.normalize(kept.float(), p=2.0, dim=-1)
        return F32(v.cpu().contiguous().numpy().tobytes())
