"""The step-time model: how long a step takes for the work it holds, fitted by least squares
over a log's own steps (docs/design/whatif.md, "What-if replay").

A step's time from `ready` to `end` has two parts, each linear in its features:
  gap      ready -> plan: publishing the previous step's tokens, reading inputs, the loop;
  forward  plan -> commit: scheduling, the batch, the model, sampling.
The per-unit costs of work (the gap's features, and the forward's up to `decode_ctx_k`) are
non-negative: more work never takes less time. The forward's cost in the step's token count
is piecewise linear, bending every ROW_ALIGN tokens up to 64 and at 128 and 256 (the
`tokens_over_*` features, free of sign): the linear layers' time is flat while they read
weights and rises once rows fill the matmul, and the worker pads rows to a multiple of 4.
A decode verified with k drafts is k + 1 query rows, each sampled and attending its own
causal context: its rows are `verify_rows` (not `decode_rows`), their keys are in
`decode_ctx_k` and they count in the step's tokens. A log without verified decodes cannot fit
`verify_rows`; it then costs what `decode_rows` does (docs/design/whatif.md, "Speculative
decoding in a what-if").
`RecordedTimes` is the other timer a simulation takes: each recorded step's own times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from replay.timeline import Step
from replay.trace import TraceError
from worker.linear import ROW_ALIGN

WORK = ("const", "prefill_tokens", "prefill_attn_k", "prefill_seqs", "decode_rows",
        "decode_ctx_k", "verify_rows")
DECODE_ROWS, VERIFY_ROWS = WORK.index("decode_rows"), WORK.index("verify_rows")
KNOTS = (*range(ROW_ALIGN, 65, ROW_ALIGN), 128, 256)
FORWARD = (*WORK, *(f"tokens_over_{k}" for k in KNOTS))
GAP = ("const", "prev_tokens")
MIN_STEPS = 30       # usable steps below which a fit is refused
HOLD_OUT = 5         # every 5th usable step is held out for the error estimate
OUTLIER = 10         # a step this many median absolute residuals slow is a hiccup


def forward_features(prefill, decode_ctx, drafts=()) -> list[float]:
    """prefill_attn_k: (query, key) pairs of the prefill chunks over 1000 (a chunk of length
    l from position s attends l*s + l(l+1)/2 keys); decode_ctx_k: keys the decode rows attend
    (a decode of context c verified with k drafts: (k+1)c + k(k+1)/2); verify_rows: the rows
    of the decodes with drafts (`drafts`: each decode's count, aligned with `decode_ctx`);
    tokens_over_k: how far the step's tokens, padded to ROW_ALIGN, exceed k."""
    attn = sum(l * s + l * (l + 1) / 2 for _, s, l, _ in prefill)
    tokens = sum(c[2] for c in prefill)
    keys, verify = float(sum(decode_ctx)), 0
    for c, k in zip(decode_ctx, drafts):
        if k:
            keys += k * c + k * (k + 1) / 2
            verify += k + 1
    decodes = len(decode_ctx) + sum(drafts)
    padded = -(-(tokens + decodes) // ROW_ALIGN) * ROW_ALIGN
    return [1.0, float(tokens), attn / 1e3, float(len(prefill)), float(decodes - verify),
            keys / 1e3, float(verify), *(max(0.0, float(padded - k)) for k in KNOTS)]


def gap_features(prev_sampled: int) -> list[float]:
    return [1.0, float(prev_sampled)]


def dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b))


@dataclass(frozen=True)
class StepModel:
    forward: tuple[float, ...]
    gap: tuple[float, ...]
    r2: float          # of ready -> end, over every usable step
    mape: float        # of ready -> end on held-out steps (fitted without them), as a fraction
    steps: int
    verify_steps: int = 0   # of them, steps with verified decodes (0: verify_rows borrowed)

    def gap_s(self, k: int, prev_sampled: int) -> float:
        return dot(self.gap, gap_features(prev_sampled))

    def forward_s(self, k: int, features: list[float]) -> float:
        return dot(self.forward, features)

    def describe(self) -> str:
        lines = [f"step-time model from {self.steps} steps: R^2 {self.r2:.4f}, "
                 f"MAPE on held-out steps {self.mape * 100:.2f}%",
                 "  forward (plan -> commit), seconds per unit:"]
        lines += [f"    {n:<16} {c:.3e}" for n, c in zip(FORWARD, self.forward)]
        lines.append(f"    (verify_rows fitted on {self.verify_steps} steps with drafts)"
                     if self.verify_steps else
                     "    (verify_rows: decode_rows' cost; the log has no verified decodes)")
        lines.append("  gap (ready -> plan), seconds per unit:")
        lines += [f"    {n:<16} {c:.3e}" for n, c in zip(GAP, self.gap)]
        return "\n".join(lines)


class RecordedTimes:
    """Step k takes exactly what recorded step k took (the simulation of the recorded
    configuration must then reproduce the recorded schedule, step for step)."""

    def __init__(self, steps: list[Step]):
        self.steps = steps

    def _step(self, k: int) -> Step:
        if k >= len(self.steps):
            raise TraceError(f"the simulation ran past the log's {len(self.steps)} steps")
        return self.steps[k]

    def gap_s(self, k: int, prev_sampled: int) -> float:
        s = self._step(k)
        return s.start - s.ready

    def forward_s(self, k: int, features: list[float]) -> float:
        s = self._step(k)
        return s.end - s.start


def fit(steps: list[Step], where: str = "the log") -> StepModel:
    usable = [s for s in steps if s.usable and (s.prefill or s.decode)]
    if len(usable) < MIN_STEPS:
        raise TraceError(f"{where} has {len(usable)} usable steps; fitting a step-time model"
                         f" needs at least {MIN_STEPS}")
    train = [s for i, s in enumerate(usable) if i % HOLD_OUT != HOLD_OUT - 1]
    test = [s for i, s in enumerate(usable) if i % HOLD_OUT == HOLD_OUT - 1]
    held = _robust(train)
    errs = [abs(_total(held, s) - (s.end - s.ready)) / (s.end - s.ready)
            for s in test if s.end > s.ready]
    fwd, gap = _robust(usable)
    y = [s.end - s.ready for s in usable]
    mean = sum(y) / len(y)
    ss_tot = sum((v - mean) ** 2 for v in y)
    ss_res = sum((_total((fwd, gap), s) - v) ** 2 for s, v in zip(usable, y))
    verify_steps = sum(1 for s in usable if any(s.drafts))
    if not verify_steps:   # an all-zero column fits 0: a verify row costs as a decode row
        fwd[VERIFY_ROWS] = fwd[DECODE_ROWS]
    return StepModel(tuple(fwd), tuple(gap), 1 - ss_res / ss_tot if ss_tot > 0 else 1.0,
                     sum(errs) / len(errs) if errs else 0.0, len(usable), verify_steps)


def _robust(steps: list[Step]) -> tuple[list[float], list[float]]:
    """The slopes from the steps without hiccups (a step slower than the fit by more than
    OUTLIER times the median absolute residual: a warm-up, a pause; at most 5% of the steps),
    then the constant raised so that the model's total time over every step is the
    recorded total: hiccups are spread over all steps, not into the slopes."""
    fwd, gap = _fit_parts(steps)
    res = [(s.end - s.ready) - _total((fwd, gap), s) for s in steps]
    scale = sorted(map(abs, res))[len(res) // 2]
    slow = sorted((r, i) for i, r in enumerate(res) if r > OUTLIER * scale)[::-1]
    drop = {i for _, i in slow[:len(steps) // 20]}
    if drop:
        fwd, gap = _fit_parts([s for i, s in enumerate(steps) if i not in drop])
    excess = sum(s.end - s.ready - _total((fwd, gap), s) for s in steps) / len(steps)
    fwd[0] = max(0.0, fwd[0] + excess)
    return fwd, gap


def _fit_parts(steps: list[Step]) -> tuple[list[float], list[float]]:
    fwd = nnls([forward_features(s.prefill, s.decode_ctx, s.drafts) for s in steps],
               [s.end - s.start for s in steps], signed=range(len(WORK), len(FORWARD)))
    gap = nnls([gap_features(s.prev_sampled) for s in steps], [s.start - s.ready for s in steps])
    return fwd, gap


def _total(parts, s: Step) -> float:
    fwd, gap = parts
    return (dot(fwd, forward_features(s.prefill, s.decode_ctx, s.drafts))
            + dot(gap, gap_features(s.prev_sampled)))


def nnls(X: list[list[float]], y: list[float], signed=()) -> list[float]:
    """Least squares with every coefficient >= 0 but those in `signed`: solve, drop the
    most negative constrained feature, solve again (enough for a handful of them)."""
    p = len(X[0])
    active = list(range(p))
    free = set(signed)
    while active:
        beta = lstsq([[row[j] for j in active] for row in X], y)
        held = [i for i, j in enumerate(active) if j not in free]
        worst = min(held, key=beta.__getitem__, default=None)
        if worst is None or beta[worst] >= 0:
            out = [0.0] * p
            for j, b in zip(active, beta):
                out[j] = b
            return out
        del active[worst]
    return [0.0] * p


def lstsq(X: list[list[float]], y: list[float]) -> list[float]:
    """Least squares by QR (modified Gram-Schmidt, orthogonalized twice) on columns scaled
    to at most 1; a column (nearly) in the span of those before it, or all zeros, gets 0."""
    p = len(X[0])
    scale = [max((abs(row[j]) for row in X), default=0.0) or 1.0 for j in range(p)]
    kept: list[int] = []
    Q: list[list[float]] = []
    R = [[0.0] * p for _ in range(p)]
    for j in range(p):
        v = [row[j] / scale[j] for row in X]
        norm0 = math.sqrt(dot(v, v))
        for _ in range(2):
            for i, q in zip(kept, Q):
                c = dot(q, v)
                R[i][j] += c
                v = [a - c * b for a, b in zip(v, q)]
        norm = math.sqrt(dot(v, v))
        if norm0 == 0.0 or norm <= 1e-9 * norm0:
            continue
        R[j][j] = norm
        kept.append(j)
        Q.append([a / norm for a in v])
    qty = [dot(q, y) for q in Q]
    beta = [0.0] * p
    for n in reversed(range(len(kept))):
        j = kept[n]
        acc = qty[n] - sum(R[j][k] * beta[k] for k in kept[n + 1:])
        beta[j] = acc / R[j][j]
    return [b / s for b, s in zip(beta, scale)]
