"""The core's link to the frontend (docs/design/processes.md, "Joined replicas").

Beside its frontend the core binds a PULL (requests in) and a PUSH (events out) that the
frontend connects to. A replica that joins a frontend elsewhere (scripts/serve --join)
instead connects one DEALER to the frontend's --replica-address, so that only the frontend
listens, and says Leave when it stops. Every core says Beat every BEAT_S, mid-step too: a
core that stops (SIGSTOP, a stuck machine) says nothing, and its silence is how the
frontend notices it (a joined core's pid names nothing here; a stopped local one is alive).
"""
from __future__ import annotations

import os
import time

import zmq

from core.ipc.channel import Channel
from core.ipc.curve import REPLICAS, client_options, load_peer
from core.ipc.protocol import (AbortRequest, AddRequest, Beat, Drain, Hello, JoinRefused,
                               Leave, StatsQuery, StopRequest)

BEAT_S = 0.5
FROM_FRONTEND = (AddRequest, AbortRequest, StopRequest, StatsQuery, Drain, Hello, JoinRefused)
LEAVE_LINGER_MS = 1000


def keys(curve: str | None) -> dict[int, bytes]:
    """A joiner's CURVE options: the frontend's public key and DIR/replicas' first pair."""
    return {} if curve is None else client_options(*load_peer(curve, REPLICAS))


class Refused(Exception):
    """The frontend this replica joined will not route to it: it said so (JoinRefused), or
    its CURVE handshake refused this replica's key."""


class FrontendLink:
    def __init__(self, ctx: zmq.Context, frontend_in: str | None, frontend_out: str | None,
                 join: str | None = None, curve: str | None = None):
        self.joined = join is not None
        self._refusals: zmq.Socket | None = None   # a joiner's with CURVE: see below
        self._join = join
        self._next_beat = 0.0
        # Unbounded both ways: the core reads its inputs even mid-step and never blocks on
        # a stalled frontend, so neither side ever drops or waits on the other; memory is
        # bounded by the requests admitted.
        if self.joined:
            sock_in = Channel(ctx, zmq.DEALER, join, bind=False, accept=FROM_FRONTEND,
                              unbounded=True, options={zmq.IMMEDIATE: 1, **keys(curve)})
            self.fe_in = self.fe_out = sock_in
            # A key the frontend does not list fails every handshake, silently for zmq,
            # which retries forever: the monitor is how the replica learns it and stops with
            # one line instead of waiting out serve's --startup-timeout.
            if curve is not None:
                self._refusals = sock_in.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        else:
            self.fe_in = Channel(ctx, zmq.PULL, frontend_in, bind=True, accept=FROM_FRONTEND,
                                 unbounded=True)
            self.fe_out = Channel(ctx, zmq.PUSH, frontend_out, bind=True, unbounded=True)

    def beat(self) -> None:
        """Beat when one is due. A joined core's IMMEDIATE drops it while no frontend is
        connected, and a bound PUSH does not queue without a peer, so beats never pile up
        for a frontend that is down."""
        if time.monotonic() < self._next_beat:
            return
        self._next_beat = time.monotonic() + BEAT_S
        self.fe_out.try_send(Beat(os.getpid()))
        self._check_refused()

    def _check_refused(self) -> None:
        """Refused once the frontend's CURVE handshake refused this replica's key."""
        if self._refusals is not None and self._refusals.poll(0):
            raise Refused(f"{self._join} refused this replica's CURVE key (the frontend's "
                          "--curve DIR/replicas/ does not list its public key)")

    def close(self) -> None:
        if self._refusals is not None:
            self._refusals.close(linger=0)
        if self.joined:
            self.fe_out.try_send(Leave(os.getpid()))
            self.fe_out.sock.close(linger=LEAVE_LINGER_MS)
            return
        self.fe_in.close()
        self.fe_out.close()
