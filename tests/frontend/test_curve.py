"""CurveZMQ on the frontend's endpoints (docs/security.md, "CurveZMQ"): only listed keys
talk to it, refusals are logged rate-limited, stats() is the operator's, and a refused
joiner learns nothing. A fake core stands behind a real frontend process."""
from __future__ import annotations

import multiprocessing
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from core.ipc.curve import OPERATOR, load_server
from core.ipc.protocol import Beat, CoreReady, Hello, JoinRefused, ModelInfo, decode, encode
from frontend.client import Client, ClientError
from scripts.group import keygen
from tests.fake_core import REPO, running_engine
from tests.frontend.test_frontend_lifecycle import free_port

FLOOD = 300   # bad handshakes while a listed client streams


def make_keys(root: Path) -> Path:
    assert keygen.main([str(root), "--clients", "2"]) == 0
    return root


def listed(keys: Path, **kw) -> Client:
    return Client(kw.pop("address"), server_key=str(keys / "server.key"),
                  client_key=str(keys / "clients" / "client0.key_secret"), **kw)


def test_keygen_writes_the_documented_layout(tmp_path):
    keys = make_keys(tmp_path / "k")
    for name in ("server", "clients/client0", "clients/client1", "replicas/replica0"):
        assert (keys / f"{name}.key").is_file()
        assert stat.S_IMODE((keys / f"{name}.key_secret").stat().st_mode) == 0o600
    d = load_server(keys)
    assert sorted(d.clients.values()) == ["clients/client0", "clients/client1"]
    assert list(d.replicas.values()) == ["replicas/replica0"]
    assert OPERATOR not in d.clients.values()
    before = (keys / "server.key_secret").read_bytes()
    assert keygen.main([str(keys), "--client", "alice"]) == 0   # adds, keeps the server's
    assert (keys / "server.key_secret").read_bytes() == before
    assert "clients/alice" in load_server(keys).clients.values()


@pytest.fixture(scope="module")
def curved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve")
    keys = make_keys(tmp / "keys")
    with running_engine(tmp, "--curve", str(keys)) as eng:
        yield eng, keys


# A refused client's 503 comes from its own timeout (no connection ever answers it), so the
# wait is the test's cost, not a margin: half a second more would prove nothing more.
REFUSED_WAIT = 0.75


def refused(address: str, request_id: str, **kw) -> None:
    with Client(address, timeout=REFUSED_WAIT, **kw) as c:
        with pytest.raises(ClientError) as e:
            c.generate("hello", max_tokens=4, request_id=request_id)
        assert e.value.code == 503


def test_the_listed_client_streams(curved):
    eng, keys = curved
    with listed(keys, address=eng.address) as c:
        deltas = list(c.stream("hello", max_tokens=8))
    assert "".join(d.text for d in deltas) == "hello"
    assert deltas[-1].finish_reason is not None


def test_peers_without_a_listed_key_never_reach_the_core(curved):
    eng, keys = curved
    other_public, other_secret = zmq.curve_keypair()
    refused(eng.address, "plain")
    refused(eng.address, "wrong-server", server_key=other_public,
            client_key=str(keys / "clients" / "client0.key_secret"))
    refused(eng.address, "unlisted", server_key=str(keys / "server.key"),
            client_key=(other_public, other_secret))
    for request_id in ("plain", "wrong-server", "unlisted"):
        assert eng.core.add_of(request_id, timeout=0.2) is None
    assert eng.fe.proc.poll() is None
    assert "Traceback" not in eng.fe.stderr()


def test_stats_is_the_operators_call(curved):
    eng, keys = curved
    with listed(keys, address=eng.address) as c:
        with pytest.raises(ClientError) as e:
            c.stats()
    assert e.value.code == 403
    with Client(eng.address, server_key=str(keys / "server.key"),
                client_key=str(keys / "server.key_secret")) as op:
        assert op.stats()["total_blocks"] == 128


def bad_handshakes(address: str, count: int, server_key: bytes) -> None:
    """`count` connections that each fail the handshake: half plain, half unlisted keys.
    Run in a process of its own: the fake core's thread shares this one's GIL."""
    ctx = zmq.Context()
    try:
        for k in range(count):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            if k % 2:
                public, secret = zmq.curve_keypair()
                s.setsockopt(zmq.CURVE_SERVERKEY, server_key)
                s.setsockopt(zmq.CURVE_PUBLICKEY, public)
                s.setsockopt(zmq.CURVE_SECRETKEY, secret)
            s.connect(address)
            try:
                s.send(b"junk", zmq.NOBLOCK)
            except zmq.Again:
                pass
            time.sleep(0.005)
            s.close(0)
    finally:
        ctx.term()


def test_a_flood_of_bad_handshakes_does_not_stop_a_listed_client(curved):
    eng, keys = curved
    server_key = load_server(keys).server.public
    flood = multiprocessing.get_context("spawn").Process(
        target=bad_handshakes, args=(eng.address, FLOOD, server_key))
    flood.start()
    try:
        with listed(keys, address=eng.address, timeout=30) as c:
            texts = [c.generate(f"req{k}", max_tokens=8).text for k in range(20)]
    finally:
        flood.join(60)
        if flood.is_alive():
            flood.kill()
    assert flood.exitcode == 0
    assert texts == [f"req{k}" for k in range(20)]
    time.sleep(0.5)
    lines = [ln for ln in eng.fe.stderr().splitlines() if "refused" in ln
             and "connection(s)" in ln]
    # one line per 10 s with a count, never one per handshake
    assert 1 <= len(lines) <= 3, lines
    assert "Traceback" not in eng.fe.stderr()


def fake_replica(address: str, **options) -> zmq.Socket:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    for opt, value in options.items():
        s.setsockopt(getattr(zmq, opt), value)
    s.connect(address)
    return s


def test_a_replica_with_an_unlisted_key_gets_nothing(tmp_path):
    """The fake core does not beat: with a replica address the frontend drops it after 2 s,
    so this checks the frontend itself lives on."""
    keys = make_keys(tmp_path / "keys")
    replica_address = f"tcp://127.0.0.1:{free_port()}"
    with running_engine(tmp_path, "--curve", str(keys), "--replica-address",
                        replica_address) as eng:
        rogue_joins(keys, replica_address)
        assert eng.fe.proc.poll() is None
        assert "unlisted key" in eng.fe.stderr() and "Traceback" not in eng.fe.stderr()


def rogue_joins(keys: Path, replica_address: str) -> None:
    public, secret = zmq.curve_keypair()
    s = fake_replica(replica_address, CURVE_SERVERKEY=load_server(keys).server.public,
                     CURVE_PUBLICKEY=public, CURVE_SECRETKEY=secret)
    try:
        for _ in range(3):
            try:   # no handshake succeeds, so there is no peer to queue to
                s.send(encode(Beat(4242)), zmq.NOBLOCK)
            except zmq.Again:
                pass
            assert not s.poll(250), "an unlisted replica was answered"
    finally:
        s.close(0)


@pytest.fixture()
def plain_joins(tmp_path):
    replica_address = f"tcp://127.0.0.1:{free_port()}"
    with running_engine(tmp_path, "--replica-address", replica_address) as eng:
        yield eng, replica_address


def test_a_refused_joiner_learns_no_field_of_the_frontend(plain_joins, tmp_path):
    """The attacker's check: before, each refusal named the field and this frontend's
    value (model, vocabulary, EOS ids, tokenizer path), one probe each."""
    eng, replica_address = plain_joins
    s = fake_replica(replica_address)
    try:
        s.send(encode(Beat(4242)))
        assert s.poll(5000)
        hello = decode(s.recv())
        assert isinstance(hello, Hello)
        mine = ModelInfo(model="probe", num_blocks=1, block_size=16, max_model_len=8,
                         vocab_size=3, eos_ids=[1], tokenizer="/nowhere")
        s.send(encode(CoreReady(mine, 4242, 4243, hello.epoch)))
        assert s.poll(5000)
        answer = decode(s.recv())
    finally:
        s.close(0)
    assert isinstance(answer, JoinRefused)
    assert answer.reason == "refused"
    theirs = eng.core.info   # what the attacker wanted to learn
    for value in (theirs.model, theirs.vocab_size, theirs.tokenizer, theirs.max_model_len):
        assert str(value) not in answer.reason
    assert "refused the replica" in eng.fe.stderr()   # the operator still hears why


def refuses(module: str, *args: str) -> str:
    """The stderr of `python -m module args`, which must exit 2 before starting anything."""
    p = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    return p.stderr


def test_a_non_loopback_bind_needs_curve_or_insecure_remote(tmp_path):
    serve = ("scripts.group.supervisor", "--no-log", "--model", "null")
    for where in (["--address", "tcp://0.0.0.0:0"], ["--replica-address", "tcp://0.0.0.0:0"]):
        assert "--insecure-remote" in refuses(*serve, *where, "--allow-remote")
        assert "--allow-remote" in refuses(*serve, *where)   # the loopback rule stands
    assert "TCPStore" in refuses(*serve, "--tp", "2", "--nnodes", "2", "--allow-remote",
                                 "--dist-init", "tcp://10.1.2.3:29500")
    assert "--curve" in refuses(*serve, "--join", "tcp://10.1.2.3:7700")
    assert "cannot read the key file" in refuses(*serve, "--curve", str(tmp_path / "none"))
    fe = ("frontend", "--core-in", f"ipc://{tmp_path}/a", "--core-out", f"ipc://{tmp_path}/b",
          "--address", "tcp://0.0.0.0:0", "--allow-remote")
    assert "--insecure-remote" in refuses(*fe)


def own_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        host = s.getsockname()[0]
    return None if host.startswith("127.") else host


def test_without_curve_stats_is_for_this_machine_only(tmp_path):
    host = own_address()
    if host is None:
        pytest.skip("this machine has no non-loopback address")
    port = free_port()
    with running_engine(tmp_path, "--address", f"tcp://0.0.0.0:{port}", "--allow-remote",
                        "--insecure-remote") as eng:
        with Client(f"tcp://{host}:{port}", timeout=10) as remote:
            with pytest.raises(ClientError) as e:
                remote.stats()
            assert e.value.code == 403
            assert remote.generate("hi", max_tokens=4).text == "hi"   # requests still go
        with Client(f"tcp://127.0.0.1:{port}", timeout=10) as local:
            assert local.stats()["total_blocks"] == 128
        assert eng.fe.proc.poll() is None


def test_a_refused_client_keeps_getting_503_and_never_hangs(curved):
    """A refused handshake leaves the client no connection: zmq would wait forever to
    queue the next request on one (a CI run hung there); the send times out as a 503."""
    eng, keys = curved
    other_public, other_secret = zmq.curve_keypair()
    with Client(eng.address, timeout=REFUSED_WAIT, server_key=str(keys / "server.key"),
                client_key=(other_public, other_secret)) as c:
        for i in range(2):
            t0 = time.monotonic()
            with pytest.raises(ClientError) as e:
                c.generate("hello", max_tokens=4, request_id=f"again{i}")
            assert e.value.code == 503 and time.monotonic() - t0 < REFUSED_WAIT * 5
            time.sleep(0.3)


def test_a_refused_async_client_never_hangs_either(curved):
    import asyncio

    from frontend.client import AsyncClient
    eng, keys = curved
    other = zmq.curve_keypair()

    async def main():
        codes = []
        async with AsyncClient(eng.address, timeout=REFUSED_WAIT, client_key=other,
                               server_key=str(keys / "server.key")) as c:
            for i in range(2):
                try:
                    await c.generate("hello", max_tokens=4, request_id=f"a{i}")
                except ClientError as e:
                    codes.append(e.code)
                await asyncio.sleep(0.3)
        return codes

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [503, 503]
