"""StepTimes: every step's duration in a fixed-bucket histogram, kept by the core.

The gateway exports it as Prometheus' tl_step_duration_seconds as it is (stats() carries
it), so the histogram sees each step, not one mean per scrape, at the cost of a bisect
per step and no per-step message.
"""
from __future__ import annotations

from bisect import bisect_left

# upper bounds in ms (Prometheus' `le`: a step of exactly a bound falls in that bucket)
BOUNDS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)


class StepTimes:
    def __init__(self, bounds_ms: tuple[float, ...] = BOUNDS_MS):
        self.bounds_ms = bounds_ms
        self._counts = [0] * (len(bounds_ms) + 1)   # per bucket; the last is +Inf
        self.sum_ms = 0.0

    def observe(self, ms: float) -> None:
        self._counts[bisect_left(self.bounds_ms, ms)] += 1
        self.sum_ms += ms

    def snapshot(self) -> dict:
        """{"le_ms": bounds, "counts": cumulative count per bound then +Inf, "sum_ms"}."""
        cumulative, total = [], 0
        for c in self._counts:
            total += c
            cumulative.append(total)
        return {"le_ms": list(self.bounds_ms), "counts": cumulative, "sum_ms": self.sum_ms}


def merge_snapshots(snaps: list[dict]) -> dict | None:
    """Replicas' snapshots summed bucket by bucket (None when their bounds differ)."""
    if not snaps or any(s["le_ms"] != snaps[0]["le_ms"] for s in snaps):
        return None
    return {"le_ms": snaps[0]["le_ms"],
            "counts": [sum(c) for c in zip(*(s["counts"] for s in snaps))],
            "sum_ms": sum(s["sum_ms"] for s in snaps)}
