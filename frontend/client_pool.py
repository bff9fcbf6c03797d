"""ClientPool: the gateway's AsyncClients, one per HTTP peer address.

The frontend bounds, fails and drops requests per client (--max-inflight-per-client, a
lost connection): one client per peer keeps one HTTP user's flood or failure its own.
Members are made on first use, closed once idle for IDLE_S, and at most `size` exist:
past that, peers share members by hash.
"""
from __future__ import annotations

import asyncio
import time
import zlib

from frontend.async_client import AsyncClient

IDLE_S = 60.0


class ClientPool:
    def __init__(self, address: str, timeout: float, size: int = 64):
        self.address, self.timeout, self.size = address, timeout, size
        self._members: dict[str, AsyncClient] = {}
        self._busy: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self.control = AsyncClient(address, timeout=timeout)   # stats(), health

    def key(self, peer: str | None) -> str:
        peer = peer or "-"
        if peer in self._members or len(self._members) < self.size:
            return peer
        keys = sorted(self._members)
        return keys[zlib.crc32(peer.encode()) % len(keys)]

    def client(self, key: str) -> AsyncClient:
        if key not in self._members:
            self._members[key] = AsyncClient(self.address, timeout=self.timeout)
            self._busy[key] = 0
        self._last[key] = time.monotonic()
        return self._members[key]

    async def stream(self, peer: str | None = None, **kwargs):
        """AsyncClient.stream on `peer`'s member, as an async generator."""
        key = self.key(peer)
        client = self.client(key)
        self._busy[key] += 1
        try:
            async for d in client.stream(**kwargs):
                yield d
        finally:
            self._busy[key] -= 1
            self._last[key] = time.monotonic()

    async def stats(self) -> dict:
        return await self.control.stats()

    async def reap(self) -> None:
        """Close members with nothing in flight for IDLE_S."""
        now = time.monotonic()
        idle = [k for k, n in self._busy.items() if n == 0 and now - self._last[k] > IDLE_S]
        for k in idle:
            client = self._members.pop(k)
            del self._busy[k], self._last[k]
            await client.close()

    async def close(self) -> None:
        clients = [*self._members.values(), self.control]
        self._members.clear()
        await asyncio.gather(*(c.close() for c in clients))

    def __len__(self) -> int:
        return len(self._members)
