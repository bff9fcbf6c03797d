"""A socket pair that lets a signal wake a zmq poll at once (signal.set_wakeup_fd), or
another thread (poke).

Without it a SIGTERM arriving during a poll is seen only when the poll times out.
"""
from __future__ import annotations

import socket


class Wakeup:
    def __init__(self):
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def read_fd(self) -> int:
        """Register this in the poller."""
        return self._r.fileno()

    def write_fd(self) -> int:
        """Give this to signal.set_wakeup_fd."""
        return self._w.fileno()

    def poke(self) -> None:
        """Wake the poll from another thread (the tokenizing one, frontend/tokenizing.py)."""
        try:
            self._w.send(b"\0")
        except BlockingIOError:
            pass   # the buffer is full: the poll will wake anyway

    def clear(self) -> None:
        try:
            while self._r.recv(512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        self._r.close()
        self._w.close()
