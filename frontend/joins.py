"""The frontend's --replica-address: engine replicas that join from elsewhere
(scripts/serve --join), beat, and leave or fall silent (docs/design/processes.md, "Joined replicas").

A joining core connects a DEALER here and beats. An unknown core that beats is greeted with
Hello in an epoch of its own (again at most every GREET_S, in the same epoch); its CoreReady
for that epoch makes it a JoinedReplica, unless it cannot stand in for the frontend's own
(frontend/replicas.py same_model), which is answered JoinRefused. A core that was dropped
(silent) and beats again is unknown by then: the new epoch makes it abort what it held
before it is routed to.
"""
from __future__ import annotations

import time

import zmq

from core.ipc.channel import Router, RouterError
from core.ipc.protocol import DEFAULT_MAX_FRAME_BYTES, Hello, Leave, ProtocolError
from frontend.replicas import CORE_TYPES, JoinedReplica
from frontend.silence import AwakeClock, Silence

GREET_S = 2.0


class Joins:
    def __init__(self, ctx: zmq.Context, address: str, max_frame_bytes: int,
                 clock: AwakeClock, options: dict[int, int | bytes] | None = None):
        self.router = Router(ctx, address, accept=(*CORE_TYPES, Leave),
                             max_bytes=max(max_frame_bytes, DEFAULT_MAX_FRAME_BYTES),
                             options=options, handover=True)
        self.address = self.router.address
        self._clock = clock
        self._by_ident: dict[bytes, JoinedReplica] = {}
        self._greeted: dict[bytes, tuple[float, int]] = {}   # ident -> (when, epoch)

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

    def greet(self, ident: bytes, pid: int, new_epoch) -> None:
        """Hello to a new core that beats (it answers CoreReady); `new_epoch()` gives the
        epoch of its first greeting."""
        now = time.monotonic()
        when, epoch = self._greeted.get(ident, (-GREET_S, None))
        if now - when >= GREET_S:
            epoch = new_epoch() if epoch is None else epoch
            self._greeted[ident] = (now, epoch)
            self.router.send(ident, Hello(pid, epoch))

    def answers_greeting(self, ident: bytes, msg) -> bool:
        """`msg` is the CoreReady that answers our Hello (not one from before it)."""
        return self._greeted.get(ident, (0, None))[1] == msg.epoch

    def add(self, ident: bytes, index: int, epoch: int) -> JoinedReplica:
        self._greeted.pop(ident, None)
        r = self._by_ident[ident] = JoinedReplica(index, self.router, ident,
                                                  Silence(self._clock), epoch)
        return r

    def forget(self, r: JoinedReplica) -> None:
        self._by_ident.pop(r.ident, None)

    def left(self, msg) -> bool:
        return isinstance(msg, Leave)

    def close(self, linger: int) -> None:
        self.router.sock.close(linger=linger)
