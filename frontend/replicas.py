"""The frontend's link to one engine replica (a core with its worker): what its CoreReady
said, whether it is up, and the work the frontend has given it. A LocalReplica's core runs
beside the frontend (scripts/serve --dp); a JoinedReplica's core joined from elsewhere
through the frontend's --replica-address (docs/design/processes.md, "Joined replicas")."""
from __future__ import annotations

import logging

import zmq

from core.ipc.channel import Channel, Router
from core.ipc.lifeline import pid_alive
from core.ipc.protocol import (DEFAULT_MAX_FRAME_BYTES, Beat, CoreReady, CoreStats, ModelInfo,
                               Rejected, StepEvents)
from frontend.silence import Silence

log = logging.getLogger("frontend")

CORE_TYPES = (CoreReady, Rejected, StepEvents, CoreStats, Beat)


class Replica:
    """What the frontend knows of a replica, however it is reached. `silence` (None: not
    watched, a lone local replica with nowhere to re-run) finds a stopped core."""
    joined = False

    def __init__(self, index: int, silence: Silence | None):
        self.index = index
        self.info: ModelInfo | None = None
        self.pids: dict[str, int] = {}   # core and worker, from CoreReady
        self.up = False                  # it said CoreReady and its core has not died since
        self.load = 0                    # outstanding tokens of the requests sent here
        self.epoch = 0                   # of the Hello it must answer before it is routed to
        self.silence = silence

    def heard(self) -> None:
        if self.silence is not None:
            self.silence.heard()

    def ready(self, msg: CoreReady) -> None:
        self.info, self.up = msg.info, True
        self.pids.update(core=msg.pid, worker=msg.worker_pid)
        self.heard()

    def died(self) -> bool:
        """True once, when its core is found gone (or silent: stopped)."""
        if not self.up or not self._gone():
            return False
        self.up, self.load = False, 0
        return True

    def silent(self) -> bool:
        return self.silence is not None and self.silence.silent()

    def _gone(self) -> bool:
        raise NotImplementedError

    def send(self, msg) -> bool:
        raise NotImplementedError


class JoinedReplica(Replica):
    """A core elsewhere: reached through the frontend's replica ROUTER by its identity, its
    pid unknowable from here, so its silence is its death."""
    joined = True

    def __init__(self, index: int, router: Router, ident: bytes, silence: Silence,
                 epoch: int):
        super().__init__(index, silence)
        self._router, self.ident, self.epoch = router, ident, epoch

    def left(self) -> None:
        self.silence.gone_now()

    def _gone(self) -> bool:
        return self.silence.silent()

    def send(self, msg) -> bool:
        if self._router.send(self.ident, msg):
            return True
        log.error("joined replica %d is gone: dropped %s", self.index, type(msg).__name__)
        return False


SAME = ("model", "weights", "dtype", "tp", "vocab_size", "eos_ids", "tokenizer",
        "batch_invariant", "max_model_len", "block_size")


def same_model(a: ModelInfo, b: ModelInfo) -> str | None:
    """Why a replica serving `b` cannot stand in for one serving `a` (None: it can): it
    must give the same tokens (the same weights, by their digest, in the same dtype and
    split) and take every request `a`'s frontend accepts (the same context, a pool that
    holds what `a`'s holds)."""
    for name in SAME:
        if getattr(a, name) != getattr(b, name):
            return f"it serves {name} {getattr(b, name)!r}, this frontend {getattr(a, name)!r}"
    need = min(a.num_blocks, -(-a.max_model_len // a.block_size))
    if b.num_blocks < need:
        return (f"its KV pool of {b.num_blocks} blocks cannot hold a request of "
                f"{min(a.num_blocks * a.block_size, a.max_model_len)} tokens, which this "
                f"frontend accepts (it needs {need} blocks of {a.block_size})")
    return None


class LocalReplica(Replica):
    """A core on this machine: the frontend connects to the PULL and PUSH it binds."""

    def __init__(self, ctx: zmq.Context, index: int, core_in: str, core_out: str,
                 max_frame_bytes: int, silence: Silence | None):
        super().__init__(index, silence)
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
        return self.dead() or (self.silent() and not self._unread())

    def _unread(self) -> bool:
        """Frames wait in its socket: the frontend, not the core, is behind (its own
        socket, so another replica's traffic cannot hide this one's silence)."""
        return bool(self.core_out.sock.get(zmq.EVENTS) & zmq.POLLIN)

    def dead(self) -> bool:
        pid = self.pids.get("core")
        return pid is not None and not pid_alive(pid)


def least_loaded(replicas: list[Replica]) -> Replica | None:
    """The live replica with the least outstanding work; ties to the lowest index."""
    live = [r for r in replicas if r.up]
    return min(live, key=lambda r: (r.load, r.index)) if live else None
