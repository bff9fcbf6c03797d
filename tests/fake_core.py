"""Test doubles for the frontend: a scripted core (a thread), a byte-level tokenizer, and a
helper that runs `python -m frontend` as a real process.

The fake core binds the two core endpoints, sends CoreReady once `ready` is set, and
answers each AddRequest by echoing the prompt's tokens then EOS, one token per step. The
prompt's text picks a script: "hang..." never produces a token, "reject..." is refused
with 429, "slow..." produces one token per SLOW_S seconds.
"""
from __future__ import annotations

import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import zmq

from core.ipc.channel import Channel
from core.ipc.protocol import (I32, AbortRequest, AddRequest, CoreReady, CoreStats, Deltas, Drain,
                           Hello, ModelInfo, Pong, Rejected, StatsQuery, StepEvents, StopRequest,
                           decode, encode)
from worker.preset_tokenizer import EOS as EOS_TEXT
from worker.preset_tokenizer import EOS_ID, NUM_FIXED, build_tokenizer

EOS = EOS_ID
VOCAB = NUM_FIXED  # bytes and the specials
MAX_MODEL_LEN = 128
SLOW_S = 0.1
REPO = Path(__file__).resolve().parent.parent


def make_byte_tokenizer(path: Path) -> str:
    """The project's byte-level tokenizer (token i is byte i, EOS = 256) saved into `path`.

    Written with `tokenizers` alone, so the test process never imports transformers; the
    frontend loads it with AutoTokenizer.from_pretrained.
    """
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(VOCAB).save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TEXT}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)


def model_info(tokenizer_dir: str) -> ModelInfo:
    return ModelInfo(model="fake", num_blocks=128, block_size=16, max_model_len=MAX_MODEL_LEN,
                     vocab_size=VOCAB, eos_ids=[EOS], tokenizer=tokenizer_dir)


@dataclass
class _Running:
    add: AddRequest
    script: list[int]
    period: float
    next_at: float
    produced: int = 0


@dataclass
class FakeCore:
    core_in: str
    core_out: str
    info: ModelInfo
    step_s: float = 0.002
    ready: threading.Event = field(default_factory=threading.Event)
    received: list = field(default_factory=list)

    def __post_init__(self):
        self._cv = threading.Condition()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-core", daemon=True)
        self._running: dict[int, _Running] = {}
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.steps = 0

    # ------------------------------------------------------------ test side

    def start(self) -> "FakeCore":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)

    def wait_for(self, pred, timeout: float = 5.0):
        """The first received message satisfying `pred`, waiting up to `timeout`; or None."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                hit = next((m for m in self.received if pred(m)), None)
                left = deadline - time.monotonic()
                if hit is not None or left <= 0:
                    return hit
                self._cv.wait(left)

    def inject(self, frame: bytes) -> None:
        """Send a raw frame (junk, or a message the test encoded) to the frontend."""
        self._outbox.put(frame)

    def add_of(self, request_id: str, timeout: float = 5.0) -> AddRequest | None:
        return self.wait_for(lambda m: isinstance(m, AddRequest)
                             and m.request_id == request_id, timeout)

    def stop_of(self, fid: int, timeout: float = 5.0) -> StopRequest | None:
        return self.wait_for(lambda m: isinstance(m, StopRequest) and m.fid == fid, timeout)

    def abort_of(self, fid: int, timeout: float = 5.0) -> AbortRequest | None:
        return self.wait_for(lambda m: isinstance(m, AbortRequest) and m.fid == fid, timeout)

    # ------------------------------------------------------------ core side

    def _run(self) -> None:
        ctx = zmq.Context()
        pull = Channel(ctx, zmq.PULL, self.core_in, bind=True,
                       accept=(AddRequest, AbortRequest, StopRequest, StatsQuery, Drain, Hello))
        push = Channel(ctx, zmq.PUSH, self.core_out, bind=True)
        sent_ready = False
        try:
            while not self._halt.is_set():
                if self.ready.is_set() and not sent_ready:
                    sent_ready = self._try_send(push, CoreReady(self.info, os.getpid(), os.getpid()))
                if pull.poll(int(self.step_s * 1000) + 1):
                    while pull.poll(0):
                        self._on_message(pull.recv(), push)
                self._step(push)
                while not self._outbox.empty():
                    push.sock.send(self._outbox.get())
        finally:
            pull.close()
            push.close()
            ctx.term()

    @staticmethod
    def _try_send(push: Channel, msg) -> bool:
        try:  # a bound PUSH with no peer yet would block
            push.sock.send(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _on_message(self, msg, push: Channel) -> None:
        with self._cv:
            self.received.append(msg)
            self._cv.notify_all()
        if isinstance(msg, AddRequest):
            self._on_add(msg, push)
        elif isinstance(msg, AbortRequest):
            self._running.pop(msg.fid, None)
        elif isinstance(msg, StopRequest):
            if self._running.pop(msg.fid, None) is not None:
                push.send(StepEvents(I32(), I32(), [[msg.fid, "stop", {"queue_ms": 0.0}]]))
        elif isinstance(msg, StatsQuery):
            push.send(CoreStats(msg.qid, self._stats()))

    def _on_add(self, add: AddRequest, push: Channel) -> None:
        text = bytes(t for t in add.prompt if t < 256).decode("utf-8", "replace")
        if text.startswith("reject"):
            push.send(Rejected(add.fid, 429, "waiting queue full"))
            return
        script = [] if text.startswith("hang") else list(add.prompt) + [EOS]
        period = SLOW_S if text.startswith("slow") else 0.0
        self._running[add.fid] = _Running(add, script, period, time.monotonic() + period)

    def _step(self, push: Channel) -> None:
        now = time.monotonic()
        fids, tokens, finished = [], [], []
        for fid, r in list(self._running.items()):
            if not r.script or now < r.next_at:
                continue
            tok = r.script[r.produced % len(r.script)]
            r.produced += 1
            r.next_at = now + r.period
            fids.append(fid)
            tokens.append(tok)
            reason = ("stop" if tok == EOS and not r.add.ignore_eos
                      else "length" if r.produced >= r.add.max_tokens else None)
            if reason:
                finished.append([fid, reason])
                del self._running[fid]
        if fids:
            self.steps += 1
            push.send(StepEvents(I32(fids), I32(tokens), finished))

    def _stats(self) -> dict:
        return {"running": len(self._running), "waiting": 0, "free_blocks": 100,
                "total_blocks": 128, "steps": self.steps, "preemptions": 0,
                "pids": {"core": os.getpid(), "worker": os.getpid()}}


class FrontendProc:
    """`python -m frontend` as a subprocess; its stderr goes to a file for post-mortems."""

    def __init__(self, tmp: Path, *args: str):
        self.log_path = tmp / "frontend.stderr"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "frontend", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=self._log)
        self.address: str | None = None

    def wait_ready(self, timeout: float = 60) -> str:
        line = self._read_line(timeout)
        if not line.startswith("READY "):
            raise RuntimeError(f"frontend did not get ready: {line!r}\n{self.stderr()}")
        self.address = line.split(" ", 1)[1]
        return self.address

    def _read_line(self, timeout: float) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return ""
        return self.proc.stdout.readline().decode().strip()

    def stderr(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


class RawClient:
    """A bare DEALER for sending frames the real Client never would."""

    def __init__(self, address: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self._pending: deque = deque()   # the rest of a Deltas frame's deltas

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def send_msg(self, msg) -> None:
        self.send(encode(msg))

    def recv(self, timeout: float = 5.0, skip=(Pong,)):
        """The next reply that is not a heartbeat, a Deltas frame's one Delta at a time;
        None after `timeout`."""
        deadline = time.monotonic() + timeout
        while not self._pending and (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            msg = decode(self.sock.recv(), max_bytes=1 << 30)
            msgs = msg.unpack() if isinstance(msg, Deltas) else [msg]
            self._pending.extend(m for m in msgs if not isinstance(m, skip))
        return self._pending.popleft() if self._pending else None

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@dataclass
class Engine:
    """A fake core and a real frontend process in front of it."""
    address: str
    core: FakeCore
    fe: FrontendProc

    def fid(self, request_id: str) -> int:
        add = self.core.add_of(request_id)
        assert add is not None, f"the core never saw {request_id}"
        return add.fid


@contextmanager
def running_engine(tmp: Path, *frontend_args: str) -> Iterator[Engine]:
    core = FakeCore(f"ipc://{tmp}/in", f"ipc://{tmp}/out",
                    model_info(make_byte_tokenizer(tmp / "tok")))
    core.ready.set()
    core.start()
    fe = FrontendProc(tmp, "--core-in", core.core_in, "--core-out", core.core_out,
                      "--address", "tcp://127.0.0.1:0", *frontend_args)
    try:
        fe.wait_ready()
        yield Engine(fe.address, core, fe)
        assert fe.proc.poll() is None, fe.stderr()
    finally:
        fe.stop()
        core.stop()
