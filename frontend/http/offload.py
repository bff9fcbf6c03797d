"""Work the gateway does off its event loop: /tokenize and /detokenize (tokens.py).

Tokenizing 1 MiB took the loop for most of a second, so ten such bodies held /v1/models
and every stream for seconds. The work runs on one thread instead (the `tokenizers`
library lets go of the GIL while it works); at most PER_USER jobs of one user
(identity.py) and QUEUED in all wait or run at once, and more get 429. A job counts until
the thread is done with it, not until its client leaves: a client that disconnects does
not free room for more while its job still runs.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from frontend.http.errors import ApiError

PER_USER = 8
QUEUED = 64


class Offload:
    def __init__(self, per_user: int = PER_USER, queued: int = QUEUED):
        self.per_user, self.queued = per_user, queued
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gateway-tokenize")
        self._users: dict[str, int] = {}

    async def run(self, identity: str, fn: Callable, *args):
        """fn(*args) on the thread; what it returns or raises (an ApiError passes on)."""
        if self._users.get(identity, 0) >= self.per_user:
            raise ApiError(429, f"this user already has {self.per_user} tokenizer jobs "
                                "queued or running")
        if sum(self._users.values()) >= self.queued:
            raise ApiError(429, f"the tokenizer has {self.queued} jobs queued or running")
        self._users[identity] = self._users.get(identity, 0) + 1
        loop = asyncio.get_running_loop()
        job = self._pool.submit(functools.partial(fn, *args))
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done, identity))
        return await asyncio.wrap_future(job)

    def _done(self, identity: str) -> None:
        left = self._users.pop(identity) - 1
        if left:
            self._users[identity] = left
