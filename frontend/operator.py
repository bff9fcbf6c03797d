"""Who may call stats(): the operator (docs/security.md, "CurveZMQ").

stats() tells the engine's load and its prefix cache's hits, which a client could read to
learn what others send. With --curve only a peer presenting the server's own key pair (the
ZAP handler names it OPERATOR) may call it; without CURVE only a peer on this machine: every
peer of a loopback or ipc:// endpoint, else one whose Peer-Address is a loopback host.
"""
from __future__ import annotations

from dataclasses import dataclass

import zmq

from core.ipc.channel import is_loopback, is_loopback_host
from core.ipc.curve import OPERATOR

NOT_OPERATOR = ("stats() is an operator call: present the server's key pair (--curve), or"
                " call from the frontend's machine")


@dataclass(frozen=True)
class OperatorRule:
    curve: bool
    address: str    # the client endpoint, as bound

    @property
    def needs_frame(self) -> bool:
        """Whether a message's frame must be kept to decide (Router keep_frame)."""
        return self.curve or not is_loopback(self.address)

    def allows(self, frame: zmq.Frame | None) -> bool:
        if not self.needs_frame:
            return True
        if frame is None:
            return False
        try:
            if self.curve:
                return frame.get("User-Id") == OPERATOR
            return is_loopback_host(frame.get("Peer-Address"))
        except zmq.ZMQError:   # the property is absent: nothing vouches for the peer
            return False
