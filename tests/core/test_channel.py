"""core/ipc/channel.py alone: which endpoints count as local, the hard frame cap, and a
Router's sends to peers gone."""
from __future__ import annotations

import pytest
import zmq

from core.ipc.channel import Router, hard_frame_cap, is_loopback
from core.ipc.protocol import DEFAULT_MAX_FRAME_BYTES, Delta, Ping, decode


@pytest.mark.parametrize("address", [
    "tcp://127.0.0.1:7600", "tcp://127.9.9.9:0", "tcp://localhost:7600", "tcp://[::1]:7600",
    "ipc:///tmp/tl-engine/core-in", "inproc://core",
])
def test_local_endpoints(address):
    assert is_loopback(address)


@pytest.mark.parametrize("address", [
    "tcp://0.0.0.0:7600", "tcp://*:7600", "tcp://10.0.0.1:7600", "tcp://example.com:7600",
    "tcp://eth0:7600", "tcp://127.0.0.1;10.0.0.1:7600", "tcp://[::1:7600",
    "tipc://{5560,0,0}", "pgm://eth0;239.192.1.1:5555", "epgm://eth0;239.192.1.1:5555",
    "vmci://1:5555", "ws://127.0.0.1:5555", "wss://127.0.0.1:5555", "udp://127.0.0.1:5555",
    "norm://127.0.0.1:5555", "TCP://127.0.0.1:7600", "127.0.0.1:7600", "",
])
def test_everything_else_is_remote(address):
    assert not is_loopback(address)


def test_hard_cap_reads_realistic_oversize_frames():
    assert hard_frame_cap(DEFAULT_MAX_FRAME_BYTES) >= 256 << 20
    assert hard_frame_cap(16 << 20) == 64 * (16 << 20)


def test_a_burst_reaches_a_peer_in_order_and_names_each_peer_gone_once(tmp_path):
    ctx = zmq.Context()
    router = Router(ctx, f"ipc://{tmp_path}/r", accept=(Ping,))
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.ROUTING_ID, b"peer")
    peer.connect(f"ipc://{tmp_path}/r")
    try:
        peer.send(router.encode(Ping()))
        assert router.poll(5000) and router.recv()[0] == b"peer"   # now the router knows it
        deltas = [Delta("r", str(k), [k]) for k in range(5)]
        frames = [(ident, router.encode(d)) for d in deltas for ident in (b"peer", b"gone")]
        assert router.send_encoded(frames) == [b"gone"]
        got = [decode(peer.recv()) for _ in deltas if peer.poll(5000)]
        assert got == deltas
        assert router.send(b"peer", Ping()) and not router.send(b"gone", Ping())
    finally:
        peer.close(0)
        router.close()
        ctx.term()


def _dealer(ctx, address: str, ident: bytes):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, ident)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


@pytest.mark.parametrize("handover", [False, True])
def test_a_second_connection_claiming_a_peers_id_gets_none_of_its_replies(tmp_path, handover):
    """The client ROUTER (handover off): the replies stay with the connection that sent the
    request. With handover on (the replica ROUTER's setting) the claimant takes them: the
    control, which shows the test can tell the two apart."""
    ctx = zmq.Context()
    router = Router(ctx, f"ipc://{tmp_path}/r", accept=(Ping,), handover=handover)
    victim = _dealer(ctx, router.address, b"victim-id")
    victim.send(encode_ping())
    assert router.poll(5000) and router.recv()[0] == b"victim-id"
    thief = _dealer(ctx, router.address, b"victim-id")
    thief.send(encode_ping())
    router.poll(200)   # the thief's frame arrives only where it was let in
    for _ in range(5):
        router.send(b"victim-id", Delta(request_id="r", token_ids=[1], text="x"))
    owner, other = (thief, victim) if handover else (victim, thief)
    try:
        # the replies reach their owner within the first wait; the other had that, and more
        assert owner.poll(5000) == zmq.POLLIN and other.poll(200) == 0
    finally:
        for s in (victim, thief):
            s.close(0)
        router.close()
        ctx.term()


def encode_ping() -> bytes:
    from core.ipc.protocol import encode
    return encode(Ping())
