"""The arithmetic of `scripts/bench quality`, pure: the text's windows, which positions of a
window are scored, perplexity from logprobs, and greedy agreement (docs/design/benchmarks.md, "Quality").

Windows are llama-perplexity's (tools/perplexity/perplexity.cpp, `perplexity()` without
`--ppl-stride`): the tokens cut into consecutive, non-overlapping windows of `ctx` tokens
(the tail short of a whole window is dropped), each evaluated alone from an empty cache,
and only the second half scored: with first = ctx // 2, the tokens at window positions
first + 1 .. ctx - 1, each predicted from the logits of the position before it. So every
scored token has at least ctx // 2 tokens of context, and the three scorers see the same
windows and score the same (ctx - first - 1) tokens of each.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def windows(tokens: Sequence[int], ctx: int) -> list[list[int]]:
    """The text's tokens as len(tokens) // ctx windows of ctx tokens each."""
    if ctx < 4:
        raise ValueError(f"ctx {ctx}: a window needs at least 4 tokens")
    return [list(tokens[i * ctx:(i + 1) * ctx]) for i in range(len(tokens) // ctx)]


def scored_positions(ctx: int) -> range:
    """The window positions whose tokens are scored (as targets)."""
    return range(ctx // 2 + 1, ctx)


def scored_logprobs(window_logprobs: Sequence[float | None], ctx: int) -> list[float]:
    """From one window's prompt logprobs (entry p: logprob of the token at position p
    given those before it; entry 0 has none), the scored ones."""
    if len(window_logprobs) != ctx:
        raise ValueError(f"{len(window_logprobs)} prompt logprobs for a window of {ctx}")
    out = [window_logprobs[p] for p in scored_positions(ctx)]
    if any(lp is None or not math.isfinite(lp) for lp in out):
        raise ValueError("a scored position has no finite logprob")
    return out


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    tokens: int        # tokens scored
    nll: float         # their mean negative log-likelihood (nats)

    def as_dict(self) -> dict:
        return {"ppl": self.ppl, "tokens": self.tokens, "nll": self.nll}


def perplexity(per_window: Sequence[Sequence[float]]) -> Perplexity:
    """exp of the mean negative logprob over every scored token of every window."""
    flat = [lp for w in per_window for lp in w]
    if not flat:
        raise ValueError("no scored tokens")
    nll = -math.fsum(flat) / len(flat)
    return Perplexity(math.exp(nll), len(flat), nll)


def relative_diff(value: float | None, reference: float | None) -> float | None:
    """|value - reference| / reference; None when either is missing."""
    if value is None or reference is None:
        return None
    return abs(value - reference) / reference


# ---------------------------------------------------------------- greedy agreement

END = -1   # stands for "ended by an end-of-generation token" in a normalized sequence


def normalized(tokens: Sequence[int], eog: frozenset[int], n: int) -> list[int]:
    """The first n generated tokens, cut at the first end-of-generation token, which
    becomes END: the engine reports the token that stopped it, llama-server may not, and
    either may stop on any EOG token."""
    out = []
    for t in tokens[:n]:
        if t in eog:
            return out + [END]
        out.append(int(t))
    return out


def parting(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two normalized sequences differ (one ending first counts);
    None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_margin(top: dict[int, float] | None) -> float | None:
    """The logprob gap between the best and second-best tokens of one position."""
    if not top or len(top) < 2:
        return None
    best, second = sorted(top.values(), reverse=True)[:2]
    return best - second


def agreement(engine: Sequence[tuple[Sequence[int], Sequence[dict]]],
              peer: Sequence[Sequence[int]], eog: frozenset[int], n: int) -> dict:
    """How many requests' first n tokens are identical between the engine (tokens, top-2
    per token) and the peer (tokens), and where each other pair parts: the position, both
    tokens there (None: that side had ended) and the engine's top-2 margin there."""
    parted = []
    for i, ((toks, tops), other) in enumerate(zip(engine, peer, strict=True)):
        a, b = normalized(toks, eog, n), normalized(other, eog, n)
        at = parting(a, b)
        if at is None:
            continue
        parted.append({"request": i, "position": at,
                       "engine": int(toks[at]) if at < len(a) else None,
                       "llamacpp": int(other[at]) if at < len(b) else None,
                       "margin": top2_margin(tops[at] if at < len(tops) else None)})
    margins = sorted(p["margin"] for p in parted if p["margin"] is not None)
    return {"requests": len(peer), "first_tokens": n, "identical": len(peer) - len(parted),
            "margin_median": margins[len(margins) // 2] if margins else None,
            "margin_max": margins[-1] if margins else None,
            "parted": parted}
