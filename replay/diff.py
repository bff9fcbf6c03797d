"""The first step where two step logs of the same inputs differ."""
from __future__ import annotations

from itertools import zip_longest

from replay.logfile import LogFile

FIELDS = ("schedule", "outputs", "free_blocks", "running", "waiting", "hash")


def first_difference(a: LogFile, b: LogFile) -> str | None:
    for ra, rb in zip_longest(a.steps(), b.steps()):
        if ra is None or rb is None:
            longer, row = (b, rb) if ra is None else (a, ra)
            return f"step {row.step}: only {longer.path} has it (the other log ends before)"
        diffs = [f"  {f}: {getattr(ra, f)!r} != {getattr(rb, f)!r}"
                 for f in FIELDS if getattr(ra, f) != getattr(rb, f)]
        if diffs:
            return f"step {ra.step} differs:\n" + "\n".join(diffs)
    return None
