"""The first difference between two step logs of the same inputs: in the steps, then the
requests (a request missing from one, or changed), then the inputs."""
from __future__ import annotations

from dataclasses import fields
from itertools import zip_longest

from core.logrecords import StepRecord, is_clock
from replay.logfile import LogFile

# What a step did (not when, nor how long): the same inputs give the same values.
FIELDS = tuple(f.name for f in fields(StepRecord) if not is_clock(f) and f.name != StepRecord.key)
REQUEST_CLOCK = {"arrival_time"}   # the requests table's clock column


def first_difference(a: LogFile, b: LogFile) -> str | None:
    return _steps(a, b) or _requests(a, b) or _inputs(a, b)


def _steps(a: LogFile, b: LogFile) -> str | None:
    for ra, rb in zip_longest(a.steps(), b.steps()):
        if ra is None or rb is None:
            longer, row = (b, rb) if ra is None else (a, ra)
            return f"step {row.step}: only {longer.path} has it (the other log ends before)"
        diffs = [f"  {f}: {getattr(ra, f)!r} != {getattr(rb, f)!r}"
                 for f in FIELDS if getattr(ra, f) != getattr(rb, f)]
        if diffs:
            return f"step {ra.step} differs:\n" + "\n".join(diffs)
    return None


def _requests(a: LogFile, b: LogFile) -> str | None:
    for seq_id in sorted(a.requests.keys() | b.requests.keys()):
        ra, rb = a.requests.get(seq_id), b.requests.get(seq_id)
        if ra is None or rb is None:
            return f"request {seq_id}: only {(b if ra is None else a).path} has it"
        diffs = [f"  {k}: {ra[k]!r} != {rb[k]!r}" for k in ra
                 if k not in REQUEST_CLOCK and ra[k] != rb[k]]
        if diffs:
            return f"request {seq_id} differs:\n" + "\n".join(diffs)
    return None


def _inputs(a: LogFile, b: LogFile) -> str | None:
    for step in sorted(a.inputs.keys() | b.inputs.keys()):
        ia, ib = a.inputs.get(step, []), b.inputs.get(step, [])
        if ia != ib:
            return f"inputs before step {step} differ:\n  {ia!r} != {ib!r}"
    return None
