"""The frontend's ZAP handler (docs/security.md, "CurveZMQ"): with --curve, libzmq asks it
about every CURVE handshake on the client and replica ROUTERs, and it admits only the public
keys listed for that socket's domain (core/ipc/curve.py). It runs on a thread of its own, on
the frontend's context, so a flood of handshakes costs the serving loop nothing but the GIL
for a few microseconds each.

Refusals are counted from the routers' monitors (a peer without CURVE, or with a wrong
server key, fails before ZAP is asked) and logged as one line per LOG_EVERY_S with their
count: a flood cannot fill the log, and a refusal is never a traceback.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from core.ipc.curve import CurveDir, load_server, server_options

log = logging.getLogger("frontend")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
LOG_EVERY_S = 10.0
POLL_MS = 100
REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


@dataclass
class RefusalLog:
    """One warning line per `every` seconds at most, with the refusals counted since."""
    every: float = LOG_EVERY_S
    count: int = 0
    last_why: str = ""
    _next: float = 0.0

    def refused(self, endpoint: str, why: str) -> None:
        self.count += 1
        self.last_why = f"{endpoint}: {why}"
        self.flush(time.monotonic())

    def flush(self, now: float) -> None:
        if self.count and now >= self._next:
            log.warning("refused %d connection(s) without a listed CURVE key in the last "
                        "%.0f s (last: %s)", self.count, self.every, self.last_why)
            self.count, self._next = 0, now + self.every


@dataclass
class ZapHandler:
    """Answers ZAP requests for `keys` and counts the handshakes the routers refused."""
    ctx: zmq.Context
    keys: CurveDir
    refusals: RefusalLog = field(default_factory=RefusalLog)

    def __post_init__(self):
        # bound before any CURVE socket binds: a handshake finding no handler is refused
        self._zap = self.ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitors: list[zmq.Socket] = []
        self._reason: str | None = None   # the last ZAP refusal, for the log line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zap", daemon=True)

    def watch(self, sock: zmq.Socket) -> None:
        """Count the handshakes `sock` refuses (call before start)."""
        self._monitors.append(sock.get_monitor_socket(REFUSED))

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._zap, *self._monitors):
            s.close(0)

    def _run(self) -> None:
        poller = zmq.Poller()
        for s in (self._zap, *self._monitors):
            poller.register(s, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(POLL_MS):
                    if sock is self._zap:
                        self._zap.send_multipart(self.answer(self._zap.recv_multipart()))
                    else:
                        self._on_event(recv_monitor_message(sock))
                self.refusals.flush(time.monotonic())
        finally:
            self._close_sockets()

    def _on_event(self, event: dict) -> None:
        why = "no CURVE, a wrong server key, or not ZeroMQ"
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH and self._reason:
            why, self._reason = self._reason, None
        endpoint = event.get("endpoint", b"")
        self.refusals.refused(endpoint.decode(errors="replace")
                              if isinstance(endpoint, bytes) else str(endpoint), why)

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """The ZAP reply (RFC 27) to one request: 200 with the key's name as User-Id, or
        400. Frames: version, request id, domain, address, routing id, mechanism, creds."""
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address, _, mechanism = frames[:6]
        name = None
        if mechanism == b"CURVE" and len(frames) == 7 and len(frames[6]) == 32:
            name = self.keys.admitted(domain.decode(errors="replace")).get(
                z85.encode(frames[6]))
        if name is None:
            self._reason = (f"{mechanism.decode(errors='replace')} peer "
                            f"{address.decode(errors='replace')} with an unlisted key")
            return [version, request_id, b"400", b"unlisted key", b"", b""]
        return [version, request_id, b"200", b"OK", name.encode(), b""]


@dataclass
class Curve:
    """The frontend's CURVE, or its absence: the server options of each ROUTER and the ZAP
    handler. Open it before any ROUTER binds, watch each, then begin."""
    keys: CurveDir | None = None
    zap: ZapHandler | None = None

    @classmethod
    def open(cls, ctx: zmq.Context, root: str | None) -> "Curve":
        if root is None:
            return cls()
        keys = load_server(root)
        return cls(keys, ZapHandler(ctx, keys))

    def options(self, domain: str) -> dict[int, int | bytes]:
        return {} if self.keys is None else server_options(self.keys.server.secret, domain)

    def watch(self, sock: zmq.Socket) -> None:
        if self.zap is not None:
            self.zap.watch(sock)

    def begin(self) -> None:
        if self.zap is not None:
            self.zap.start()

    def close(self) -> None:
        if self.zap is not None:
            self.zap.close()
