"""Typed ZeroMQ socket wrappers: each owns its bind/connect and the protocol codec.

A Channel sends and receives protocol messages on one socket; a Router does the same for
a ROUTER socket, addressing peers by their identity frame. Decoding errors surface as
ProtocolError so that the owner can answer them; nothing here ever raises on junk
without saying why.
"""
from __future__ import annotations

import hashlib
import ipaddress
from urllib.parse import urlsplit

import zmq

from core.ipc.protocol import DEFAULT_MAX_FRAME_BYTES, ProtocolError, decode, encode
from core.ipc.wire import Encoder


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


LOCAL_SCHEMES = ("ipc://", "inproc://")
# As plain ints: or-ing pyzmq's enum flags per send cost more than the send of a small frame.
_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)


def is_loopback(address: str) -> bool:
    """True for ipc:// and inproc:// endpoints and tcp:// endpoints on a loopback host;
    every other transport (tipc, pgm, epgm, vmci, ws, udp, ...) may reach other hosts."""
    if address.startswith(LOCAL_SCHEMES):
        return True
    if not address.startswith("tcp://"):
        return False
    try:
        host = urlsplit(address).hostname
    except ValueError:  # e.g. an unbalanced "[" in the host
        return False
    return is_loopback_host(host or "")


def hard_frame_cap(max_bytes: int) -> int:
    """zmq's MAXMSGSIZE for a socket whose protocol limit is `max_bytes`.

    zmq reads a whole frame into memory before the application sees it, so without a cap
    one peer could make the process allocate without bound; a frame over the cap drops
    the peer's connection with no reply. Frames between the protocol limit and the cap
    are read and answered with 413, so the cap sits far above any realistic mistake.
    """
    return max(64 * max_bytes, 1 << 28)


PEER_TIMEOUT_MS = 30_000


def _make(ctx: zmq.Context, kind: int, max_bytes: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, hard_frame_cap(max_bytes))
    return sock


class Channel:
    """One socket (PUSH, PULL, DEALER, PAIR) carrying protocol messages."""

    def __init__(self, ctx: zmq.Context, kind: int, address: str, *, bind: bool,
                 accept: tuple[type, ...] | None = None,
                 max_bytes: int = DEFAULT_MAX_FRAME_BYTES, unbounded: bool = False,
                 options: dict[int, int | bytes] | None = None):
        self.sock = _make(ctx, kind, max_bytes)
        if unbounded:  # set before bind/connect: a pipe takes its high-water mark then
            self.sock.setsockopt(zmq.SNDHWM, 0)
            self.sock.setsockopt(zmq.RCVHWM, 0)
        for opt, value in (options or {}).items():
            self.sock.setsockopt(opt, value)
        self.accept, self.max_bytes = accept, max_bytes
        (self.sock.bind if bind else self.sock.connect)(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT) if bind else address

    def send(self, msg) -> None:
        self.sock.send(encode(msg), copy=False)

    def try_send(self, msg) -> bool:
        """False (nothing sent) when no peer can take it now: none connected, or full."""
        try:
            self.sock.send(encode(msg), zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def recv(self, flags: int = 0):
        """The next message; raises ProtocolError for a bad frame (it is consumed)."""
        frames = self.sock.recv_multipart(flags, copy=True)
        if len(frames) != 1:
            raise ProtocolError(400, f"expected one frame, got {len(frames)}")
        return decode(frames[0], self.accept, self.max_bytes)

    def poll(self, timeout_ms: int | None) -> bool:
        return bool(self.sock.poll(timeout_ms, zmq.POLLIN))

    def close(self) -> None:
        self.sock.close(0)


def peer_label(ident: bytes) -> str:
    """A peer's routing id as logs show it: a short digest. The id is what a connection
    claims to be, so the log never prints one whole (whoever reads the log could claim it)."""
    return hashlib.blake2b(ident, digest_size=4).hexdigest()


class Router:
    """A ROUTER socket: messages come with the sender's identity; replies go to one peer."""

    def __init__(self, ctx: zmq.Context, address: str, *, accept: tuple[type, ...] | None,
                 max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 options: dict[int, int | bytes] | None = None, keep_frame: bool = False,
                 handover: bool = False):
        self.sock = _make(ctx, zmq.ROUTER, max_bytes)
        # keep_frame: `last_frame` is the frame of the message recv returned last, whose
        # properties (User-Id, Peer-Address) say who sent it (frontend/operator.py)
        self.keep_frame = keep_frame
        self.last_frame: zmq.Frame | None = None
        for opt, value in (options or {}).items():   # CURVE (core/ipc/curve.py): before bind
            self.sock.setsockopt(opt, value)
        # A send to a peer that is gone raises instead of being dropped silently: that
        # is how the frontend learns a client disappeared.
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A slow or busy peer is not a vanished one: no high-water mark drops or refuses
        # its frames (the owner bounds what each peer may have in flight), zmq keeps
        # reading, so heartbeats are never stuck behind unread data, and only a peer
        # silent at the transport level for HEARTBEAT_TIMEOUT is dropped.
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, PEER_TIMEOUT_MS)
        # A routing id is only what a connection claims. With handover a second connection
        # that claims a live peer's id takes over its replies (another client's stream):
        # off, zmq refuses it while the first is connected. Only the replica ROUTER, whose
        # peers are the engine's own cores, lets a restarted core take its id over at once.
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, int(handover))
        self.accept, self.max_bytes = accept, max_bytes
        self.encode = Encoder()   # the socket's thread's, as the socket is
        self.sock.bind(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(self, flags: int = 0) -> tuple[bytes, object]:
        """(identity, message); raises RouterError carrying the identity for bad frames."""
        if self.keep_frame:
            parts = self.sock.recv_multipart(flags, copy=False)
            self.last_frame = parts[-1]
            frames = [f.bytes for f in parts]
        else:
            frames = self.sock.recv_multipart(flags, copy=True)
        ident = frames[0]
        if len(frames) != 2:
            raise RouterError(ident, ProtocolError(400, f"expected one frame, got {len(frames) - 1}"))
        try:
            return ident, decode(frames[1], self.accept, self.max_bytes)
        except ProtocolError as e:
            raise RouterError(ident, e, frames[1]) from None

    def send(self, ident: bytes, msg) -> bool:
        """False when the peer is gone (nothing sent)."""
        data = self.encode(msg)   # before the first frame: a failing encode sends nothing
        return not self.send_encoded([(ident, data)])

    def send_encoded(self, frames: list[tuple[bytes, bytes]]) -> list[bytes]:
        """Each (identity, encoded message) in order; the identities whose peer is gone
        (their messages not sent), in order, once each. Sent back to back, many messages
        wake zmq's I/O thread once: sent one at a time between other work, each woke it
        (an eventfd write here, a wake-up and a socket write there)."""
        gone: dict[bytes, None] = {}
        send = self.sock.send
        for ident, data in frames:
            try:
                send(ident, _MORE)   # a multipart message is queued whole or not at all
                send(data, _LAST)
            except zmq.ZMQError as e:
                if e.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                    raise
                gone[ident] = None
        return list(gone)

    def poll(self, timeout_ms: int | None) -> bool:
        return bool(self.sock.poll(timeout_ms, zmq.POLLIN))

    def close(self) -> None:
        self.sock.close(0)


class RouterError(Exception):
    """A bad frame from a known peer: answer `error` to `ident`."""

    def __init__(self, ident: bytes, error: ProtocolError, frame: bytes = b""):
        super().__init__(str(error))
        self.ident, self.error, self.frame = ident, error, frame
