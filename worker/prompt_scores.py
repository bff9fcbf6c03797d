"""Prompt logprobs (docs/design/worker.md, "Prompt logprobs"): the log-probability of each prompt
token the batch asks about, its rank and the best alternatives at its position.

The rows come after the sample rows in the forward's logits (worker/step.py's `keep`), so
a step whose batch asks for none computes nothing more. Scores are float32 log_softmax of
the raw logits (no penalties, no temperature), row by row, so a row's values do not depend
on the other rows of the step (the batch-invariant mode's promise holds for them too).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.ipc.protocol import F64, I32, ForwardBatch
from worker.step import as_tensor

ROWS_AT_ONCE = 256   # bounds the [rows, vocab] temporaries of a long prompt's chunk


@dataclass
class PromptScores:
    """StepResult's prompt columns."""
    logprobs: F64 = field(default_factory=F64)
    ranks: I32 = field(default_factory=I32)
    top_ids: I32 = field(default_factory=I32)
    top_logprobs: F64 = field(default_factory=F64)


def check(b: ForwardBatch, vocab: int) -> None:
    """The prompt columns hang together; ValueError otherwise."""
    n = len(b.prompt_rows)
    if len(b.prompt_targets) != n or len(b.prompt_top) != n:
        raise ValueError("prompt_rows, prompt_targets and prompt_top differ in length")
    if n and (min(b.prompt_targets) < 0 or max(b.prompt_targets) >= vocab):
        raise ValueError("prompt_targets outside the vocabulary")
    if n and (min(b.prompt_top) < 0 or max(b.prompt_top) > vocab):
        raise ValueError("prompt_top outside [0, vocab]")


def score(logits: torch.Tensor, b: ForwardBatch) -> PromptScores:
    """logits: [len(b.prompt_rows), V], row m that of query token b.prompt_rows[m]. Top
    alternatives by logprob descending then id ascending (a stable sort), as the sampled
    tokens' logprobs (worker/processors.py)."""
    n = len(b.prompt_rows)
    if n == 0:
        return PromptScores()
    targets = as_tensor(b.prompt_targets, torch.int32).long()
    top = as_tensor(b.prompt_top, torch.int32).long()
    chosen, ranks, top_ids, top_lps = [], [], [], []
    for a in range(0, n, ROWS_AT_ONCE):
        z = min(n, a + ROWS_AT_ONCE)
        lp = logits[a:z].float().log_softmax(-1)
        c = lp.gather(1, targets[a:z].to(lp.device)[:, None])
        chosen.append(c.flatten().double().cpu())
        ranks.append(((lp > c).sum(-1) + 1).to(torch.int32).cpu())
        k = top[a:z]
        width = int(k.max())
        if width:
            vals, ids = lp.sort(dim=-1, descending=True, stable=True)
            keep = (torch.arange(width)[None, :] < k[:, None]).to(lp.device)
            top_ids.append(ids[:, :width][keep].to(torch.int32).cpu())
            top_lps.append(vals[:, :width][keep].double().cpu())
    out = PromptScores(F64(torch.cat(chosen).numpy().tobytes()),
                       I32(torch.cat(ranks).numpy().tobytes()))
    if top_ids:
        out.top_ids = I32(torch.cat(top_ids).numpy().tobytes())
        out.top_logprobs = F64(torch.cat(top_lps).numpy().tobytes())
    return out
