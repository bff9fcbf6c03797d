"""A run's figures from its timeline (docs/design/whatif.md, "What-if replay"): the recorded and the
predicted side are computed by these same functions, so that they compare like with like.

Per request: queue wait = start of the step that first admitted it - arrival; TTFT = end of
the step that sampled its first token - arrival; TPOT = (last token - first token) / (tokens
- 1). Makespan: first arrival to last token; throughput: generated tokens / makespan.
Speculative decoding: the drafts verified, those kept and their ratio (acceptance), counted
over the steps whose tokens came back.
"""
from __future__ import annotations

from dataclasses import dataclass

from replay.timeline import Step


@dataclass
class Times:
    arrival: float
    admitted: float | None = None
    first: float | None = None
    last: float | None = None
    tokens: int = 0


def request_times(steps: list[Step], arrivals: dict[int, float]) -> dict[int, Times]:
    t = {i: Times(a) for i, a in arrivals.items()}
    for s in steps:
        for seq_id, *_ in s.prefill:
            r = t.get(seq_id)
            if r is not None and r.admitted is None:
                r.admitted = s.start
        for seq_id in s.sampled:
            r = t.get(seq_id)
            if r is not None:
                r.first = s.end if r.first is None else r.first
                r.last, r.tokens = s.end, r.tokens + 1
    return t


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    x = (len(v) - 1) * q / 100
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def _ms(values) -> list[float]:
    return [v * 1e3 for v in values]


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def metrics(steps: list[Step], arrivals: dict[int, float], priorities: dict[int, int]) -> dict:
    """The pinned shape (docs/design/whatif.md, "What-if replay"): throughput, makespan, TTFT /
    TPOT / queue p50 and p99, preemptions, and per priority n, mean queue, TTFT p50."""
    done = _done(steps, arrivals)
    by_prio: dict[str, dict] = {}
    for p, ids in _by_priority(done, priorities).items():
        by_prio[p] = {"n": len(ids),
                      "queue_ms_mean": _r(sum(done[i].admitted - done[i].arrival
                                              for i in ids) / len(ids) * 1e3),
                      "ttft_ms_p50": _r(percentile(_ms(done[i].first - done[i].arrival
                                                       for i in ids), 50))}
    counts = draft_counts(steps).values()
    drafted, kept = sum(d for d, _ in counts), sum(k for _, k in counts)
    return {**_figures(done, min(arrivals.values(), default=0.0)),
            "preemptions": sum(len(s.preempted) for s in steps), "steps": len(steps),
            "draft_tokens": drafted, "accepted_tokens": kept,
            "acceptance": round(kept / drafted, 4) if drafted else None,
            "by_priority": by_prio}


def draft_counts(steps: list[Step]) -> dict[int, tuple[int, int]]:
    """Each request's drafts verified and drafts kept, over the run."""
    out: dict[int, tuple[int, int]] = {}
    for s in steps:
        for seq_id, drafted, kept in s.verified:
            d, k = out.get(seq_id, (0, 0))
            out[seq_id] = (d + drafted, k + kept)
    return out


def by_priority(steps: list[Step], arrivals: dict[int, float],
                priorities: dict[int, int]) -> dict[str, dict]:
    """Every figure of `metrics` (but preemptions) for each priority's requests alone."""
    done = _done(steps, arrivals)
    start = min(arrivals.values(), default=0.0)
    return {p: _figures({i: done[i] for i in ids}, start)
            for p, ids in _by_priority(done, priorities).items()}


def _done(steps: list[Step], arrivals: dict[int, float]) -> dict[int, Times]:
    return {i: r for i, r in request_times(steps, arrivals).items() if r.first is not None}


def _by_priority(done: dict[int, Times], priorities: dict[int, int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in sorted({priorities[i] for i in done}, reverse=True):
        out[str(p)] = [i for i in done if priorities[i] == p]
    return out


def _figures(done: dict[int, Times], start: float) -> dict:
    ttft = [r.first - r.arrival for r in done.values()]
    queue = [r.admitted - r.arrival for r in done.values()]
    tpot = [(r.last - r.first) / (r.tokens - 1) for r in done.values() if r.tokens > 1]
    makespan = max((r.last for r in done.values()), default=start) - start
    tokens = sum(r.tokens for r in done.values())
    return {"throughput_tok_s": _r(tokens / makespan if makespan > 0 else 0.0),
            "makespan_s": _r(makespan),
            "ttft_ms_p50": _r(percentile(_ms(ttft), 50)),
            "ttft_ms_p99": _r(percentile(_ms(ttft), 99)),
            "tpot_ms_p50": _r(percentile(_ms(tpot), 50)),
            "tpot_ms_p99": _r(percentile(_ms(tpot), 99)),
            "queue_ms_p50": _r(percentile(_ms(queue), 50)),
            "queue_ms_p99": _r(percentile(_ms(queue), 99))}
