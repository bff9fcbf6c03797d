"""The frontend's link to one engine replica (a core with its worker): its two channels,
what its CoreReady said, whether it is up, and the work the frontend has given it."""
from __future__ import annotations

import logging

import zmq

from core.ipc.channel import Channel
from core.ipc.lifeline import pid_alive
from core.ipc.protocol import (DEFAULT_MAX_FRAME_BYTES, CoreReady, CoreStats, ModelInfo,
                               Rejected, StepEvents)

log = logging.getLogger("frontend")

CORE_TYPES = (CoreReady, Rejected, StepEvents, CoreStats)


class Replica:
    def __init__(self, ctx: zmq.Context, index: int, core_in: str, core_out: str,
                 max_frame_bytes: int):
        self.index = index
        self._ctx, self._ends, self._max_bytes = ctx, (core_in, core_out), max_frame_bytes
        self.info: ModelInfo | None = None
        self.pids: dict[str, int] = {}   # core and worker, from CoreReady
        self.up = False                  # it said CoreReady and its core has not died since
        self.load = 0                    # outstanding tokens of the requests sent here
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

    def ready(self, msg: CoreReady) -> None:
        self.info, self.up = msg.info, True
        self.pids.update(core=msg.pid, worker=msg.worker_pid)

    def died(self) -> bool:
        """True once, when its core's pid is found gone."""
        pid = self.pids.get("core")
        if not self.up or pid is None or pid_alive(pid):
            return False
        self.up, self.load = False, 0
        return True


def least_loaded(replicas: list[Replica]) -> Replica | None:
    """The live replica with the least outstanding work; ties to the lowest index."""
    live = [r for r in replicas if r.up]
    return min(live, key=lambda r: (r.load, r.index)) if live else None
