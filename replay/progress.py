"""A progress bar on stderr: done/total and the elapsed time (long replays, benchmarks)."""
from __future__ import annotations

import sys
import time


class Progress:
    """`update(done)` or `tick()` per item; drawn at most every `every` seconds, and at
    the end. `close()` ends the line of a bar left unfinished."""

    def __init__(self, total: int, label: str = "", enabled: bool = True, every: float = 0.1):
        self.total, self.done, self.label, self.every = total, 0, label, every
        self.enabled = enabled and total > 0
        self.t0 = self._last = time.perf_counter()
        self._draw()

    def tick(self) -> None:
        self.update(self.done + 1)

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if self.done >= self.total or now - self._last >= self.every:
            self._last = now
            self._draw()

    def close(self) -> None:
        if self.enabled and self.done < self.total:
            sys.stderr.write("\n")

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = 30 * min(self.done, self.total) // self.total
        sys.stderr.write(f"\r  {self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{self.done}/{self.total} {time.perf_counter() - self.t0:6.1f}s")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
