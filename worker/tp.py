"""The tensor-parallel worker (`python -m worker --tp N`): N ranks over torch.distributed.

Rank 0 is the worker scripts/serve started: it hosts the rendezvous (torch.distributed's
TCPStore, at --dist-init or a free loopback port), starts the other ranks of its machine
as its children, talks to the core, broadcasts every ForwardBatch (and the final Shutdown)
to every rank, and samples from the full logits. With --nnodes M the ranks are spread over
M machines, N/M each: machine K's ranks are started there by
`scripts/serve --dist-init ... --nnodes M --node-rank K` and meet rank 0 at the rendezvous. Every rank runs every forward on its shard of the model (transformers' own
tensor-parallel plan, DistributedConfig(tp_size=N)) and its own KV heads; the all-reduces
happen inside the model. Rank 0 exits as soon as any rank dies, so serve restarts the group
as one worker (preempt all, recompute).
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from core.ipc.lifeline import REJOIN
from core.ipc.protocol import ForwardBatch, Shutdown, decode, encode
from worker.settings import LOAD_ERRORS, refuse
from worker.threads import cores, default_threads, use_threads

# Followers wait in a broadcast for as long as the core has nothing to run: no timeout.
IDLE_WAIT = datetime.timedelta(days=365)
RENDEZVOUS_WAIT = datetime.timedelta(seconds=300)
# A rank on another machine gives up on a rendezvous sooner and is started again: the
# rank 0 it met may be dying (docs/design/worker.md, "Tensor parallel over machines").
REMOTE_WAIT = datetime.timedelta(seconds=10)
CLOSED = "tl/closed"
MAX_FRAME = 1 << 30


def _log(rank: int, msg: str) -> None:
    print(f"[worker rank {rank}] {msg}", file=sys.stderr, flush=True)


def main(a, argv: list[str]) -> int:
    """Rank a.rank of a.tp; `argv` is rank 0's command line, which the followers reuse."""
    per_node = a.tp // a.nnodes
    use_threads(a.threads or default_threads(1, per_node, cores()))
    ranks: list[subprocess.Popen] = []
    stopping = threading.Event()
    host, port = rendezvous(a.dist_init)
    if a.rank == 0:
        if why := _precheck(a):
            return refuse(why)
        store = dist.TCPStore(host, port, a.tp, is_master=True, timeout=RENDEZVOUS_WAIT,
                              wait_for_workers=False)
        ranks = [_spawn(argv, r, f"tcp://{host}:{store.port}") for r in range(1, per_node)]
        threading.Thread(target=_watch, args=(ranks, stopping), daemon=True).start()
    elif a.rank < per_node:   # started by rank 0, whose rendezvous is up
        store = dist.TCPStore(host, port, a.tp, is_master=False, timeout=RENDEZVOUS_WAIT)
    else:
        store = _remote_store(a, host, port)
        if store is None:
            return REJOIN
    os.environ["LOCAL_RANK"] = str(a.rank % per_node)  # transformers binds cuda:LOCAL_RANK
    try:
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo", store=store,
                                rank=a.rank, world_size=a.tp, timeout=IDLE_WAIT)
    except (RuntimeError, dist.DistError) as e:
        if a.rank < per_node:
            raise
        _log(a.rank, f"rendezvous at {host}:{port} failed ({first_line(e)}); starting again")
        return REJOIN
    # the control broadcasts are CPU bytes, so they take gloo also beside NCCL
    control = dist.new_group(backend="gloo", timeout=IDLE_WAIT)
    if a.rank == 0:
        store.set(CLOSED, "1")   # every rank has met: a later one met a dying rank 0
    shut = False
    try:
        try:
            runner = _runner(a)
        except LOAD_ERRORS as e:
            return refuse(str(e))
        if a.rank == 0:
            shut = _lead(runner, control, ranks, a)
        else:
            _follow(runner, control)
    except KeyboardInterrupt:
        pass
    finally:
        stopping.set()
        _stop(ranks, 5.0 if shut else 0.0)
    return 0


def _precheck(a) -> str | None:
    """The refusal that needs no process group, before any rank is started (the model's
    are worker/settings.py's, checked before this)."""
    if a.device == "cuda" and torch.cuda.device_count() < a.tp // a.nnodes:
        return (f"--tp {a.tp} on cuda needs a GPU per rank here; torch sees "
                f"{torch.cuda.device_count()}")
    return None


def _remote_store(a, host: str, port: int):
    """A rank on another machine meets rank 0 at its rendezvous; None (exit REJOIN, and
    serve starts it again) while rank 0 is not there yet, or was the one that just died:
    a rank that met a dying rank 0 would wait for it for ever."""
    try:
        store = dist.TCPStore(host, port, a.tp, is_master=False, timeout=REMOTE_WAIT)
    except (RuntimeError, dist.DistError) as e:
        _log(a.rank, f"no rendezvous at {host}:{port} yet ({first_line(e)}); starting again")
        return None
    if store.check([CLOSED]):
        _log(a.rank, f"the group at {host}:{port} is complete (its rank 0 is ending); "
                     "starting again")
        return None
    return store


def rendezvous(address: str | None) -> tuple[str, int]:
    """(host, port) of a tcp://HOST:PORT rendezvous; a free loopback port without one."""
    if not address:
        return "127.0.0.1", 0
    parts = urlsplit(address)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"--dist-init wants tcp://HOST:PORT, not {address!r}")
    return parts.hostname, parts.port


def _spawn(argv: list[str], rank: int, address: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "worker", *argv, "--rank", str(rank), "--dist-init", address]
    return subprocess.Popen(cmd)


def _watch(ranks: list[subprocess.Popen], stopping: threading.Event) -> None:
    """Rank 0 exits once any rank dies: the group is restarted whole."""
    while not stopping.wait(0.1):
        if (why := _first_dead(ranks)) and not stopping.is_set():
            _exit_for(why)


def _first_dead(ranks: list[subprocess.Popen], wait: float = 0.0) -> str | None:
    deadline = time.monotonic() + wait
    while True:
        for r, p in enumerate(ranks, 1):
            if p.poll() is not None:
                return f"rank {r} (pid {p.pid}) exited with code {p.returncode}"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _exit_for(why: str) -> None:
    _log(0, f"{why}; exiting")
    os._exit(1)


def _stop(ranks: list[subprocess.Popen], grace: float) -> None:
    """Wait `grace` seconds for the ranks, then kill them: a rank blocked in a collective
    does not see SIGTERM, and holds nothing worth a clean exit."""
    deadline = time.monotonic() + grace
    for p in ranks:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _runner(a):
    from worker.load import make_runner
    return make_runner(a.model, device=a.device, dtype=a.dtype, num_blocks=a.num_blocks,
                       kv_memory=a.kv_memory, block_size=a.block_size,
                       max_model_len=a.max_model_len, tp=a.tp, quantize=a.quantize,
                       dequantize=a.dequantize)


class _Lead:
    """Rank 0's runner as process.serve sees it: each batch goes to every rank first."""

    def __init__(self, runner, control, ranks):
        self.runner, self.control, self.ranks, self.info = runner, control, ranks, runner.info
        self.grammars = runner.grammars

    def run(self, batch: ForwardBatch):
        try:
            broadcast(batch, self.control)
            return self.runner.run(batch)
        except RuntimeError as e:
            # a collective whose peer died fails here before the watcher sees the death;
            # a rank on another machine is seen only so
            _exit_for(_first_dead(self.ranks, wait=2.0) or f"a collective failed: {e}")


def _lead(runner, control, ranks, a) -> bool:
    """Serve the core; True once the Shutdown has reached every rank."""
    import zmq

    from worker.process import serve
    ctx = zmq.Context()
    try:
        serve(_Lead(runner, control, ranks), ctx, a.to_core, a.from_core)
        broadcast(Shutdown(), control)  # only after a Shutdown: never inside a broadcast
        return True
    finally:
        ctx.term()


def _follow(runner, control) -> None:
    while not isinstance(batch := receive(control), Shutdown):
        runner.logits(batch)


def broadcast(msg, group) -> None:
    """Rank 0: the message's frame to every rank, its length first."""
    data = encode(msg)
    dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0, group=group)
    dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=group)


def receive(group):
    """Ranks 1..N-1: the message rank 0 broadcast."""
    n = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(n, 0, group=group)
    buf = torch.empty(int(n), dtype=torch.uint8)
    dist.broadcast(buf, 0, group=group)
    return decode(buf.numpy().tobytes(), accept=(ForwardBatch, Shutdown), max_bytes=MAX_FRAME)


def first_line(e: Exception) -> str:
    """torch's errors carry a C++ backtrace after the first line."""
    return (str(e).splitlines() or [type(e).__name__])[0]
