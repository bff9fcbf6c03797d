"""Greedy, temperature, min-p, top-k and top-p sampling over a step's sample rows, after the
logits processors (worker/processors.py).

Seeding is stateless: the k-th generated token of a request with seed s uses one uniform
draw from a torch.Generator seeded with mix(s, k), so recompute after preemption, a worker
restart or a replay continue a seeded sequence exactly. The draw always happens on the CPU
so CPU and CUDA workers pick the same quantile.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core.ipc.protocol import ForwardBatch
from worker.processors import Logprobs, logprobs, process
from worker.step import as_tensor

_MASK64 = (1 << 64) - 1


@dataclass
class SampleParams:
    temperature: torch.Tensor  # [R] float64
    top_p: torch.Tensor        # [R] float64
    top_k: torch.Tensor        # [R] int32, <= 0 means off
    seeds: torch.Tensor        # [R] int64
    gen_index: torch.Tensor    # [R] int32
    min_p: torch.Tensor | None = None  # [R] float64, 0 means off; None: no row uses it

    @classmethod
    def from_batch(cls, b: ForwardBatch) -> SampleParams:
        return cls(as_tensor(b.temperature, torch.float64), as_tensor(b.top_p, torch.float64),
                   as_tensor(b.top_k, torch.int32), as_tensor(b.seeds, torch.int64),
                   as_tensor(b.gen_index, torch.int32),
                   as_tensor(b.min_p, torch.float64) if len(b.min_p) else None)


def mix(seed: int, index: int) -> int:
    """splitmix64 of (seed, index), as a 63-bit generator seed."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def uniform(seed: int, index: int) -> float:
    g = torch.Generator().manual_seed(mix(seed, index))
    return float(torch.rand((), generator=g, dtype=torch.float64))


def sample_step(logits: torch.Tensor, b: ForwardBatch,
                grammars=None) -> tuple[torch.Tensor, Logprobs]:
    """A step's [R, V] logits -> ([R] long token ids on the CPU, their logprobs).
    `grammars` (worker/grammar.py) masks the constrained rows after the processors, so
    that sampling and logprobs both see the mask."""
    logits = process(logits, b)
    if grammars is not None:
        logits = grammars.mask(logits, b)
    tokens = sample(logits, SampleParams.from_batch(b))
    return tokens, logprobs(logits, tokens, b)


def sample(logits: torch.Tensor, p: SampleParams) -> torch.Tensor:
    """logits [R, V] -> [R] long token ids on the CPU."""
    out = logits.argmax(-1).cpu()
    rows = (p.temperature > 0).nonzero().flatten()
    if len(rows):
        out[rows] = _draw(logits[rows.to(logits.device)].float(), p, rows)
    return out


def _draw(logits: torch.Tensor, p: SampleParams, rows: torch.Tensor) -> torch.Tensor:
    device, vocab = logits.device, logits.shape[-1]
    temp = p.temperature[rows].to(device, torch.float32)
    vals, idx = (logits / temp[:, None]).sort(-1, descending=True)
    if p.min_p is not None:   # p < min_p * p_max, in logs: nothing drops where min_p = 0
        floor = vals[:, :1] + p.min_p[rows].to(device, torch.float32).log()[:, None]
        vals = vals.masked_fill(vals < floor, float("-inf"))
    rank = torch.arange(vocab, device=device)[None, :]
    k = p.top_k[rows].to(device).long()
    k = torch.where((k <= 0) | (k > vocab), vocab, k)
    vals = vals.masked_fill(rank >= k[:, None], float("-inf"))
    probs = vals.softmax(-1)
    top_p = p.top_p[rows].to(device, torch.float32)
    before = probs.cumsum(-1) - probs   # mass of the better-ranked tokens
    probs = probs.masked_fill((before >= top_p[:, None]) & (rank > 0), 0.0)
    cdf = probs.cumsum(-1)
    u = torch.tensor([uniform(int(p.seeds[r]), int(p.gen_index[r])) for r in rows.tolist()],
                     dtype=torch.float32, device=device)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
    # u * total may round up to total; the kept tokens are a prefix, never pick past it
    pick = torch.minimum(pick, (probs > 0).sum(-1, keepdim=True) - 1)
    return idx.gather(1, pick).flatten().cpu()
