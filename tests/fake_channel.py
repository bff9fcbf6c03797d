"""Sent: a stand-in for a worker thread's channel to the core that keeps what it was given
(the grammar builds' and the step pulse's tests)."""
from __future__ import annotations


class Sent:
    def __init__(self):
        self.msgs: list = []

    def send(self, msg) -> None:
        self.msgs.append(msg)

    def close(self) -> None:
        pass
