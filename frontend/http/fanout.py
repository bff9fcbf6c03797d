"""The engine requests of one HTTP body (n per prompt), read as one stream of (choice
index, Delta) in arrival order.

Each choice's stream runs in a task of its own. A prompt's first choice starts at once; its
siblings start once it has its first token: its prompt's K/V are then computed and
registered in the prefix cache, so the siblings prefill only the prompt's last block
instead of all of it (sent together, they would be admitted in one step and each compute
the whole prompt). Leaving the `async with` (the reply is
done, a choice failed, or the HTTP client left and aiohttp cancelled the handler) cancels
every task, and each task's stream is closed on its way out: the engine aborts every
choice that had not finished.
"""
from __future__ import annotations

import asyncio
from contextlib import aclosing

from frontend.client.common import ClientError

UNFINISHED = "the engine's stream ended without a finish"


class FanOut:
    def __init__(self, client, requests: list[dict], n: int = 1, method: str = "stream"):
        """`requests`: each choice's arguments to the client's `method` (AsyncClient.stream,
        or embed_stream), n per prompt."""
        self._client, self._requests, self._n = client, requests, n
        self._method = method
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        # per prompt: its first choice answered (or ended), so its siblings may go
        self._first = [asyncio.Event() for _ in range(0, len(requests), n)]
        self.failed: int | None = None   # the index of the choice whose failure next() raised

    async def __aenter__(self) -> FanOut:
        if hasattr(self._client, "hold"):   # a counted client (pool.UserClient): room for all
            self._client.hold(len(self._requests))
        self._tasks = [asyncio.create_task(self._pump(i, kw))
                       for i, kw in enumerate(self._requests)]
        return self

    async def __aexit__(self, *exc) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if hasattr(self._client, "release"):
            self._client.release()

    async def next(self):
        """The next (index, Delta) of any choice; raises the first failure of any choice.
        Call it only while some choice has not finished."""
        i, item = await self._queue.get()
        if isinstance(item, Exception):
            self.failed = i
            raise item
        return i, item

    async def _pump(self, i: int, kw: dict) -> None:
        finished = False
        try:
            if i % self._n:
                await self._first[i // self._n].wait()
            async with aclosing(getattr(self._client, self._method)(**kw)) as deltas:
                async for d in deltas:
                    finished = d.finish_reason is not None
                    self._queue.put_nowait((i, d))
                    if d.token_ids or finished:
                        self._release(i)
            if not finished:
                self._queue.put_nowait((i, ClientError(503, UNFINISHED)))
        except Exception as e:  # noqa: BLE001  (handed to the reader, who raises it)
            self._queue.put_nowait((i, e))
        finally:
            self._release(i)

    def _release(self, i: int) -> None:
        if i % self._n == 0:
            self._first[i // self._n].set()
