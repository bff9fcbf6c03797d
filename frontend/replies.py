"""Replies: what the frontend sends its clients, over its client ROUTER, and who is gone.

A send that fails on a delta or a heartbeat means the client's connection is gone: `gone`
(the Frontend's, frontend/process.py) then aborts its requests. Errors, Pongs, stats
answers and final abort deltas are sent without that check: the next delta or heartbeat to
that client finds it gone.
"""
from __future__ import annotations

from collections.abc import Callable

from core.ipc.channel import Router
from core.ipc.protocol import Delta, Deltas, ErrorReply, Pong


class Replies:
    def __init__(self, router: Router, gone: Callable[[bytes], None]):
        self._router, self._gone = router, gone

    @property
    def encode(self):
        """The router's encoder (frontend/delta_frames.py encodes a step's frames with it)."""
        return self._router.encode

    def send(self, ident: bytes, msg) -> bool:
        return self._router.send(ident, msg)

    def error(self, ident: bytes, request_id: str | None, code: int, message: str,
              param: str | None = None) -> None:
        self._router.send(ident, ErrorReply(request_id, code, message, param))

    def aborted(self, ident: bytes, delta: Delta) -> None:
        """A request's final abort delta (the client asked, or the frontend is draining)."""
        self._router.send(ident, Deltas.of([delta]))

    def delta(self, ident: bytes, delta: Delta) -> None:
        """One delta, alone in its frame."""
        if not self._router.send(ident, Deltas.of([delta])):
            self._gone(ident)

    def deltas(self, frames: list[tuple[bytes, bytes]]) -> None:
        """Send the encoded frames; a client whose send failed is gone."""
        for ident in self._router.send_encoded(frames):
            self._gone(ident)

    def ping(self, ident: bytes) -> None:
        """The heartbeat to a client with unfinished requests."""
        if not self._router.send(ident, Pong()):
            self._gone(ident)
