"""A step's deltas gathered into one Deltas frame per client (wire 2, core/ipc/protocol.py).

A client with many requests gets one frame a step instead of one per request: one encode
and one send (two zmq frames) for all of them. Each request appears at most once in a
step, so a frame holds each request at most once, as Deltas requires.
"""
from __future__ import annotations

from typing import Callable

from core.ipc.protocol import Delta, Deltas


class DeltaFrames:
    def __init__(self, encode: Callable[[Deltas], bytes]):
        self._encode = encode
        self._frames: dict[bytes, Deltas] = {}

    def add(self, ident: bytes, delta: Delta) -> None:
        frame = self._frames.get(ident)
        if frame is None:
            frame = self._frames[ident] = Deltas()
        frame.add(delta)

    def take(self) -> list[tuple[bytes, bytes]]:
        """Each client's frame, encoded, in the order the clients first got a delta; the
        frames are forgotten."""
        frames, self._frames = self._frames, {}
        return [(ident, self._encode(frame)) for ident, frame in frames.items()]
