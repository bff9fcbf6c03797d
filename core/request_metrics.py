"""Each request's own figures, kept by the engine and sent with its finish
(docs/design/worker.md#request-metrics): time queued before first admission, preemptions, the
effective priority it was admitted with, prompt tokens served from cache.

Times are the core's monotonic clock and only ever differences of it; the frontend adds
what only it sees (time to first token and end to end, from the client's side).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from core.sched_types import SchedPolicy, SchedulerConfig


@dataclass
class RequestClock:
    arrival: float            # monotonic seconds when the core added it
    arrival_step: int
    priority: int
    admitted: float | None = None
    priority_at_admission: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0
    draft_tokens: int = 0     # drafts it was verified with (speculative decoding)
    accepted_tokens: int = 0  # of them, those kept

    def admit(self, step: int, cfg: SchedulerConfig, start: int) -> None:
        """Seen in a prefill chunk starting at `start`: at the first admission, the
        positions the prefix cache served."""
        if self.admitted is None:
            self.admitted = time.monotonic()
            self.priority_at_admission = effective_priority(self.priority, step - self.arrival_step, cfg)
            self.cached_tokens = start

    def drafted(self, drafts: int, accepted: int) -> None:
        self.draft_tokens += drafts
        self.accepted_tokens += accepted

    def figures(self, log: str | None, seq_id: int | None) -> dict:
        """The metrics sent with the finish; the pinned key "log_id" holds the seq_id.
        "log" is the step log's file name, never its path: every client reads it, and the
        server's directories are the operator's (stats() has the path)."""
        queued = (self.admitted if self.admitted is not None else time.monotonic()) - self.arrival
        return {"queue_ms": round(queued * 1e3, 3), "preemptions": self.preemptions,
                "priority": self.priority_at_admission if self.admitted is not None
                else float(self.priority),
                "cached_tokens": self.cached_tokens,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "log": None if log is None else os.path.basename(log), "log_id": seq_id}


def effective_priority(priority: int, waited_steps: int, cfg: SchedulerConfig) -> float:
    """The priority the scheduler ranked the request by after `waited_steps` steps: aging
    adds one level per aging_steps steps waited (core/sched.py's key, in levels)."""
    if cfg.policy is SchedPolicy.PRIORITY and cfg.aging_steps is not None:
        return round(priority + waited_steps / cfg.aging_steps, 6)
    return float(priority)
