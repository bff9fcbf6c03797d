"""The frontend's link to one engine replica (a core with its worker): what its CoreReady
said, whether it is up, and the work the frontend has given it. A LocalReplica's core runs
beside the frontend (scripts/serve --dp); a JoinedReplica's core joined from elsewhere
through the frontend's --replica-address (docs/DESIGN.md, "Joined replicas")."""
from __future__ import annotations

import logging
import time

import zmq

from core.ipc.channel import Channel, Router
from core.ipc.lifeline import pid_alive
from core.ipc.protocol import (DEFAULT_MAX_FRAME_BYTES, CoreReady, CoreStats, ModelInfo,
                               Rejected, StepEvents)

log = logging.getLogger("frontend")

CORE_TYPES = (CoreReady, Rejected, StepEvents, CoreStats)
SILENCE_S = 2.0   # a joined core beats every 0.5 s (core/frontend_link.py); 4 missed: dead


class Replica:
    """What the frontend knows of a replica, however it is reached."""
    joined = False

    def __init__(self, index: int):
        self.index = index
        self.info: ModelInfo | None = None
        self.pids: dict[str, int] = {}   # core and worker, from CoreReady
        self.up = False                  # it said CoreReady and its core has not died since
        self.load = 0                    # outstanding tokens of the requests sent here

    def ready(self, msg: CoreReady) -> None:
        self.info, self.up = msg.info, True
        self.pids.update(core=msg.pid, worker=msg.worker_pid)

    def died(self) -> bool:
        """True once, when its core is found gone."""
        if not self.up or not self._gone():
            return False
        self.up, self.load = False, 0
        return True

    def _gone(self) -> bool:
        raise NotImplementedError

    def send(self, msg) -> bool:
        raise NotImplementedError


class JoinedReplica(Replica):
    """A core elsewhere: reached through the frontend's replica ROUTER by its identity, its
    pid unknowable from here, so its silence is its death."""
    joined = True

    def __init__(self, index: int, router: Router, ident: bytes):
        super().__init__(index)
        self._router, self.ident = router, ident
        self.heard_at = time.monotonic()

    def heard(self) -> None:
        self.heard_at = time.monotonic()

    def left(self) -> None:
        self.heard_at = float("-inf")

    def _gone(self) -> bool:
        return time.monotonic() - self.heard_at > SILENCE_S

    def send(self, msg) -> bool:
        if self._router.send(self.ident, msg):
            return True
        log.error("joined replica %d is gone: dropped %s", self.index, type(msg).__name__)
        return False


def same_model(a: ModelInfo, b: ModelInfo) -> str | None:
    """Why a replica serving `b` cannot stand in for one serving `a` (None: it can)."""
    for name in ("model", "vocab_size", "eos_ids", "tokenizer"):
        if getattr(a, name) != getattr(b, name):
            return f"it serves {name} {getattr(b, name)!r}, this frontend {getattr(a, name)!r}"
    return None


class LocalReplica(Replica):
    """A core on this machine: the frontend connects to the PULL and PUSH it binds."""

    def __init__(self, ctx: zmq.Context, index: int, core_in: str, core_out: str,
                 max_frame_bytes: int):
        super().__init__(index)
        self._ctx, self._ends, self._max_bytes = ctx, (core_in, core_out), max_frame_bytes
        self._open()

    def _open(self) -> None:
        # Unbounded: the frontend never blocks on a core nor drops a frame to it; the
        # per-client cap and the core's queue bound what can pile up.
        core_in, core_out = self._ends
        self.core_in = Channel(self._ctx, zmq.PUSH, core_in, bind=False, unbounded=True)
        self.core_out = Channel(self._ctx, zmq.PULL, core_out, bind=False,
                                accept=CORE_TYPES, unbounded=True,
                                max_bytes=max(self._max_bytes, DEFAULT_MAX_FRAME_BYTES))

    def reopen(self) -> None:
        """New sockets after its core died: frames queued for the dead core (requests
        re-sent elsewhere since) must never reach the core that replaces it."""
        self.close(linger=0)
        self._open()

    def close(self, linger: int) -> None:
        for ch in (self.core_in, self.core_out):
            ch.sock.close(linger=linger)  # Channel.close would drop what is queued

    def send(self, msg) -> bool:
        if self.core_in.try_send(msg):
            return True
        log.error("no core connected to replica %d to take %s", self.index,
                  type(msg).__name__)
        return False

    def _gone(self) -> bool:
        pid = self.pids.get("core")
        return pid is not None and not pid_alive(pid)


def least_loaded(replicas: list[Replica]) -> Replica | None:
    """The live replica with the least outstanding work; ties to the lowest index."""
    live = [r for r in replicas if r.up]
    return min(live, key=lambda r: (r.load, r.index)) if live else None
