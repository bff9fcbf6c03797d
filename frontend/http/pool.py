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

from frontend.client.aio import AsyncClient

IDLE_S = 60.0


class ClientPool:
    def __init__(self, address: str, timeout: float, size: int = 64):
        self.address, self.timeout, self.size = address, timeout, size
        self._members: dict[str, AsyncClient] = {}
        self._used: dict[str, float] = {}
        self.control = AsyncClient(address, timeout=timeout)   # stats(), health

    def member(self, peer: str | None) -> AsyncClient:
        """The client that carries `peer`'s requests."""
        key = self._key(peer or "-")
        if key not in self._members:
            self._members[key] = AsyncClient(self.address, timeout=self.timeout)
        self._used[key] = time.monotonic()
        return self._members[key]

    def _key(self, peer: str) -> str:
        if peer in self._members or len(self._members) < self.size:
            return peer
        keys = sorted(self._members)
        return keys[zlib.crc32(peer.encode()) % len(keys)]

    async def stats(self) -> dict:
        return await self.control.stats()

    async def reap(self) -> None:
        """Close the members with nothing in flight that nobody used for IDLE_S."""
        now = time.monotonic()
        idle = [k for k, c in self._members.items()
                if not c.inflight and now - self._used[k] > IDLE_S]
        for k in idle:
            del self._used[k]
            await self._members.pop(k).close()

    async def close(self) -> None:
        clients = [*self._members.values(), self.control]
        self._members.clear()
        await asyncio.gather(*(c.close() for c in clients))

    def __len__(self) -> int:
        return len(self._members)
