"""The logits processors (repetition, frequency and presence penalties, min_tokens bans) and
the logprobs, over a step's sample rows; each runs only when its ForwardBatch column is set.

Everything is a function of the batch (the row's tokens so far travel with it), so sampling
stays stateless. Index tensors go to the logits' device; nothing loops over rows in Python.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import torch

from core.ipc.protocol import F64, I32, ForwardBatch
from worker.step import as_tensor


def process(logits: torch.Tensor, b: ForwardBatch) -> torch.Tensor:
    """[R, V] logits after penalties then bans, as float32; `logits` itself when unused."""
    if len(b.history) == 0 and len(b.banned) == 0:
        return logits
    out = logits.to(torch.float32, copy=True)
    if len(b.history):
        _penalize(out, b)
    if len(b.banned):
        rows, ids, _ = _ragged(b.banned, b.banned_start)
        out[rows.to(out.device), ids.to(out.device)] = float("-inf")
    return out


def _ragged(flat: array, start: array) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A flattened ragged column as (row, value, index within its row) of each entry."""
    bounds = as_tensor(start, torch.int32).long()
    rows = torch.repeat_interleave(torch.arange(len(bounds) - 1), bounds.diff())
    return rows, as_tensor(flat, torch.int32).long(), torch.arange(len(rows)) - bounds[rows]


def _penalize(logits: torch.Tensor, b: ForwardBatch) -> None:
    """vLLM's order: repetition over prompt and generated tokens, then frequency and
    presence over the generated ones (a row's entries from history_prompt[j] on)."""
    device = logits.device
    rows, ids, offset = _ragged(b.history, b.history_start)
    gen = (offset >= as_tensor(b.history_prompt, torch.int32)[rows]).to(device)
    rows, ids = rows.to(device), ids.to(device)
    if any(r != 1 for r in b.repetition):
        seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)
        seen[rows, ids] = True
        rep = _column(b.repetition, device)
        logits.copy_(torch.where(seen & (logits > 0), logits / rep,
                                 torch.where(seen, logits * rep, logits)))
    if any(b.frequency) or any(b.presence):
        counts = torch.zeros_like(logits)
        counts.index_put_((rows[gen], ids[gen]), torch.ones((), device=device), accumulate=True)
        logits -= (_column(b.frequency, device) * counts
                   + _column(b.presence, device) * (counts > 0))


def _column(a: array, device) -> torch.Tensor:
    """A per-row float column as float32 [R, 1] on `device`."""
    return as_tensor(a, torch.float64).to(device, torch.float32)[:, None]


@dataclass
class Logprobs:
    """StepResult's logprob columns (all empty when the batch asked for none)."""
    chosen: F64 = field(default_factory=F64)
    top_ids: I32 = field(default_factory=I32)
    top_logprobs: F64 = field(default_factory=F64)


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, b: ForwardBatch) -> Logprobs:
    """float32 log_softmax of the processed logits (before temperature, top-k, top-p, min_p):
    the chosen token's, NaN for rows not asking, and each asking row's top k = b.logprobs[j]
    alternatives, by logprob descending then id ascending (a stable sort)."""
    if len(b.logprobs) == 0:
        return Logprobs()
    k = as_tensor(b.logprobs, torch.int32).long()
    ask = (k >= 0).nonzero().flatten()
    lp = logits[ask.to(logits.device)].float().log_softmax(-1)
    chosen = torch.full((len(k),), float("nan"), dtype=torch.float64)
    chosen[ask] = lp.gather(1, tokens[ask].to(lp.device)[:, None]).flatten().double().cpu()
    out = Logprobs(F64(chosen.numpy().tobytes()))
    width = int(k[ask].max()) if len(ask) else 0
    if width > 0:
        vals, ids = lp.sort(dim=-1, descending=True, stable=True)
        keep = (torch.arange(width)[None, :] < k[ask][:, None]).to(lp.device)
        out.top_ids = I32(ids[:, :width][keep].to(torch.int32).cpu().numpy().tobytes())
        out.top_logprobs = F64(vals[:, :width][keep].double().cpu().numpy().tobytes())
    return out
