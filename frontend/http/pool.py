"""ClientPool: the gateway's AsyncClients to the frontend, and the per-user in-flight cap.

The gateway counts each user's unfinished engine requests itself (identity.py names the
user; a body with n choices is n requests, all counted from its start until it ends): past
`cap` a body gets 429, whatever client carries it. The frontend's
own cap (--max-inflight-per-client, the same number) counts per ZMQ client, so the engine
clients (members) are packed: a request goes to the first member with fewer than `cap`
requests in flight, and a member is made only when every one is full. A member therefore
never reaches the frontend's cap, one user's load never refuses another's request, and
there are at most (requests in flight) / cap + 1 members. Idle members are closed after
IDLE_S.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import AsyncIterator

from core.ipc.protocol import Delta, Generate
from frontend.caller import sign
from frontend.client.aio import AsyncClient
from frontend.http.errors import ApiError

IDLE_S = 60.0
DEFAULT_CAP = 1024   # the frontend's --max-inflight-per-client default


class ClientPool:
    def __init__(self, address: str, timeout: float, cap: int = DEFAULT_CAP,
                 keys: dict | None = None, secret: bytes | None = None):
        self.address, self.timeout, self.cap = address, timeout, cap
        self._secret = secret   # the group's: signs each request's key_hash (frontend/caller.py)
        # AsyncClient's server_key and client_key (with --curve: the operator's pair)
        self._keys = keys or {}
        self._members: list[AsyncClient] = []
        self._used: dict[AsyncClient, float] = {}
        self._users: dict[str, int] = {}    # identity -> engine requests in flight
        self.control = AsyncClient(address, timeout=timeout, **self._keys)   # stats(), health

    def member(self, identity: str) -> UserClient:
        """What carries `identity`'s requests: stream() as AsyncClient's, counted."""
        return UserClient(self, identity)

    def inflight_of(self, identity: str) -> int:
        return self._users.get(identity, 0)

    def _take(self, identity: str, count: int) -> None:
        held = self._users.get(identity, 0)
        if held + count > self.cap:
            raise ApiError(429, f"this user already has {held} of its {self.cap} requests in "
                                f"flight and asks {count} more (--max-inflight-per-client)")
        self._users[identity] = held + count

    def _give_back(self, identity: str, count: int) -> None:
        left = self._users.pop(identity, 0) - count
        if left > 0:
            self._users[identity] = left

    def _carrier(self) -> AsyncClient:
        """The first member with room. The caller starts its stream before it next yields
        to the loop, so the member's count includes it before anyone else looks."""
        client = next((c for c in self._members if c.inflight < self.cap), None)
        if client is None:
            client = SigningClient(self.address, self._secret, timeout=self.timeout,
                                   **self._keys)
            self._members.append(client)
        self._used[client] = time.monotonic()
        return client

    async def stats(self) -> dict:
        return await self.control.stats()

    async def reap(self) -> None:
        """Close the members with nothing in flight that nobody used for IDLE_S."""
        now = time.monotonic()
        idle = [c for c in self._members if not c.inflight and now - self._used[c] > IDLE_S]
        for c in idle:
            self._members.remove(c)
            del self._used[c]
            await c.close()

    async def close(self) -> None:
        clients = [*self._members, self.control]
        self._members.clear()
        await asyncio.gather(*(c.close() for c in clients))

    def __len__(self) -> int:
        return len(self._members)


class SigningClient(AsyncClient):
    """An AsyncClient whose requests carry the gateway's proof of their key_hash: the
    frontend refuses a key_hash without it (frontend/caller.py)."""

    def __init__(self, address: str, secret: bytes | None, **kw):
        super().__init__(address, **kw)
        self._secret = secret

    def _stream(self, msg: Generate) -> AsyncIterator[Delta]:
        return super()._stream(sign(msg, self._secret))


class UserClient:
    """One user's view of the pool for one HTTP body, in place of an AsyncClient."""

    def __init__(self, pool: ClientPool, identity: str):
        self._pool, self.identity = pool, identity
        self._reserved = 0

    def hold(self, count: int) -> None:
        """Room for a body's `count` engine requests at once (fanout.py), so a body whose
        choices would pass the cap is refused before any starts."""
        self._pool._take(self.identity, count)
        self._reserved += count

    def release(self) -> None:
        """Give back what hold() reserved and no stream used (choices never started)."""
        self._pool._give_back(self.identity, self._reserved)
        self._reserved = 0

    def stream(self, **kw) -> AsyncIterator[Delta]:
        """AsyncClient.stream's, on a reserved slot or one taken now; the slot is given
        back when the stream ends."""
        return self._counted("stream", kw)

    def embed_stream(self, **kw) -> AsyncIterator[Delta]:
        """AsyncClient.embed_stream's, counted as stream's are."""
        return self._counted("embed_stream", kw)

    async def _counted(self, method: str, kw: dict) -> AsyncIterator[Delta]:
        if self._reserved:
            self._reserved -= 1
        else:
            self._pool._take(self.identity, 1)
        try:
            async with aclosing(getattr(self._pool._carrier(), method)(**kw)) as deltas:
                async for d in deltas:
                    yield d
        finally:
            self._pool._give_back(self.identity, 1)
