"""The worker's time per batch, as worker/process.py writes it to the file TL_WORKER_TIMES
names: one `step ms mask_ms` line per batch (files of older workers lack mask_ms: 0). A
benchmark reads the lines of one stretch of a run by counting the lines before it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepTime:
    step: int
    ms: float              # from receiving the batch to its result
    mask_ms: float = 0.0   # of which in the constrained rows' grammars (worker/grammar.py)


def read(path: Path, skip: int = 0) -> list[StepTime]:
    """The file's lines after the first `skip`."""
    out = []
    for line in path.read_text().splitlines()[skip:]:
        step, ms, *mask = line.split()
        out.append(StepTime(int(step), float(ms), float(mask[0]) if mask else 0.0))
    return out


def count(path: Path) -> int:
    """Lines written so far (0 before the worker's first batch)."""
    return len(path.read_text().splitlines()) if path.exists() else 0
