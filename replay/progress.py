"""A small progress bar on stderr for long replays (only on a terminal, or when asked)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, every: float = 0.2):
        self.total, self.label = max(total, 1), label
        self.enabled = enabled and sys.stderr.isatty()
        self.every, self.last = every, 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every and done < self.total):
            return
        self.last = now
        filled = int(30 * done / self.total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
