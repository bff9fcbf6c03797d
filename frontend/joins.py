"""The frontend's --replica-address: engine replicas that join from elsewhere
(scripts/serve --join), beat, and leave or fall silent (docs/DESIGN.md, "Joined replicas").

A joining core connects a DEALER here and beats. An unknown core that beats is greeted with
Hello (at most every GREET_S); its CoreReady makes it a JoinedReplica, unless it serves
another model, which is answered JoinRefused.
"""
from __future__ import annotations

import time

import zmq

from core.ipc.channel import Router, RouterError
from core.ipc.protocol import (DEFAULT_MAX_FRAME_BYTES, Beat, Hello, Leave, ProtocolError)
from frontend.replicas import CORE_TYPES, JoinedReplica

GREET_S = 2.0


class Joins:
    def __init__(self, ctx: zmq.Context, address: str, max_frame_bytes: int):
        self.router = Router(ctx, address, accept=(*CORE_TYPES, Beat, Leave),
                             max_bytes=max(max_frame_bytes, DEFAULT_MAX_FRAME_BYTES))
        self.address = self.router.address
        self._by_ident: dict[bytes, JoinedReplica] = {}
        self._greeted: dict[bytes, float] = {}

    def recv(self, flags: int = 0) -> tuple[bytes, object]:
        """(identity, message); a bad frame is a ProtocolError, as from a local core."""
        try:
            return self.router.recv(flags)
        except RouterError as e:
            raise ProtocolError(e.error.code, f"joined core {e.ident.hex()}: {e.error}") from None

    def known(self, ident: bytes) -> JoinedReplica | None:
        r = self._by_ident.get(ident)
        if r is not None:
            r.heard()
        return r

    def greet(self, ident: bytes, pid: int) -> None:
        """Hello to a new core that beats (it answers CoreReady)."""
        now = time.monotonic()
        if now - self._greeted.get(ident, -GREET_S) >= GREET_S:
            self._greeted[ident] = now
            self.router.send(ident, Hello(pid))

    def greeted(self, ident: bytes) -> bool:
        return ident in self._greeted

    def add(self, ident: bytes, index: int) -> JoinedReplica:
        self._greeted.pop(ident, None)
        r = self._by_ident[ident] = JoinedReplica(index, self.router, ident)
        return r

    def forget(self, r: JoinedReplica) -> None:
        self._by_ident.pop(r.ident, None)

    def left(self, msg) -> bool:
        return isinstance(msg, Leave)

    def close(self, linger: int) -> None:
        self.router.sock.close(linger=linger)
