"""How long a replica's core has said nothing, in the frontend's own waking time.

Every core beats every 0.5 s, mid-step too (core/frontend_link.py), so SILENCE_S without a
message means its core is stopped, stuck or gone. The clock counts only the time the
frontend's loop ran: a turn of the loop longer than MAX_TURN_S (the frontend itself was
stopped, or starved of CPU) counts as MAX_TURN_S, so on waking it does not take the beats
still queued for it, unread, for silence.
"""
from __future__ import annotations

import time

SILENCE_S = 2.0     # 4 missed beats
MAX_TURN_S = 0.5    # the loop polls at most CORE_CHECK_S (0.25 s) between turns


class AwakeClock:
    def __init__(self):
        self._last = time.monotonic()
        self._awake = 0.0

    def tick(self) -> None:
        """Once per turn of the frontend's loop."""
        now = time.monotonic()
        self._awake += min(now - self._last, MAX_TURN_S)
        self._last = now

    def now(self) -> float:
        return self._awake + min(time.monotonic() - self._last, MAX_TURN_S)


class Silence:
    """When a core was last heard from, on an AwakeClock."""

    def __init__(self, clock: AwakeClock):
        self._clock = clock
        self._heard = clock.now()

    def heard(self) -> None:
        self._heard = self._clock.now()

    def gone_now(self) -> None:
        """A Leave: silent for good."""
        self._heard = float("-inf")

    def quiet_s(self) -> float:
        """Awake seconds since the core was last heard from."""
        return self._clock.now() - self._heard

    def silent(self) -> bool:
        return self.quiet_s() > SILENCE_S
