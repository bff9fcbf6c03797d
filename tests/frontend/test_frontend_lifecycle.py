"""The frontend process from start to exit: address checks, 503 before the core is ready,
READY line, and the SIGTERM drain (in-flight requests finish, stragglers are aborted,
new requests get 503, exit 0)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from core.ipc.protocol import Delta, Drain, Generate, Hello, WIRE
from frontend.client import Client, ClientError
from tests.fake_core import REPO, FakeCore, FrontendProc, RawClient, make_byte_tokenizer, model_info


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_non_loopback_address_needs_allow_remote(tmp_path):
    p = subprocess.run([sys.executable, "-m", "frontend", "--core-in", f"ipc://{tmp_path}/a",
                        "--core-out", f"ipc://{tmp_path}/b", "--address", "tcp://0.0.0.0:0"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--allow-remote" in p.stderr


@pytest.fixture
def held_core(tmp_path):
    """A fake core that sends CoreReady only when the test sets `ready`."""
    core = FakeCore(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out",
                    model_info(make_byte_tokenizer(tmp_path / "tok")))
    core.start()
    yield core
    core.stop()


def test_hello_repeats_until_the_core_answers(tmp_path, held_core):
    """A core's CoreReady is dropped when it answers before the frontend's PULL connected:
    the frontend says Hello again every heartbeat until one arrives."""
    fe = FrontendProc(tmp_path, "--core-in", held_core.core_in, "--core-out",
                      held_core.core_out, "--address", f"tcp://127.0.0.1:{free_port()}")
    try:
        def hellos(_m) -> bool:
            return sum(isinstance(m, Hello) for m in list(held_core.received)) >= 2
        assert held_core.wait_for(hellos, 30) is not None
        held_core.ready.set()
        assert fe.wait_ready()
    finally:
        fe.stop()


def test_not_ready_then_ready_then_drain(tmp_path, held_core):
    core, port = held_core, free_port()
    fe = FrontendProc(tmp_path, "--core-in", core.core_in, "--core-out", core.core_out,
                      "--address", f"tcp://0.0.0.0:{port}", "--allow-remote", "--insecure-remote",
                      "--drain-timeout", "2")   # the slow stream takes 1 s
    address = f"tcp://127.0.0.1:{port}"
    clients = [Client(address, timeout=30) for _ in range(3)]
    straggler = RawClient(address)
    try:
        early, streamer, late = clients
        for call in (lambda: early.generate("too soon"), early.stats):
            with pytest.raises(ClientError) as e:
                call()
            assert e.value.code == 503 and "not ready" in e.value.message
        core.ready.set()
        assert fe.wait_ready() == address.replace("127.0.0.1", "0.0.0.0")
        assert "reachable from other hosts" in fe.stderr()

        stream = streamer.stream("slow drain", max_tokens=100)
        first = next(stream)
        straggler.send_msg(Generate("never", "hang forever", wire=WIRE))
        fid = core.add_of("never").fid
        fe.signal()
        assert core.wait_for(lambda m: isinstance(m, Drain)) is not None
        with pytest.raises(ClientError) as e:
            late.generate("new")
        assert e.value.code == 503 and "shutting down" in e.value.message

        rest = list(stream)
        assert first.text + "".join(d.text for d in rest) == "slow drain"
        assert rest[-1].finish_reason == "stop"
        end = straggler.recv(timeout=10)
        assert isinstance(end, Delta) and end.finish_reason == "abort"
        assert core.abort_of(fid) is not None
        assert fe.proc.wait(10) == 0, fe.stderr()
    finally:
        for c in clients:
            c.close()
        straggler.close()
        fe.stop()
