"""The worker process: ForwardBatch in, StepResult out; stateless apart from the KV cache."""
from __future__ import annotations

import os
import sys

import zmq

from core.ipc.channel import Channel
from core.ipc.protocol import ForwardBatch, ProtocolError, Shutdown, WorkerReady


def _log(msg: str) -> None:
    print(f"[worker] {msg}", file=sys.stderr, flush=True)


def serve(runner, ctx: zmq.Context, to_core: str, from_core: str) -> None:
    """Report readiness, then answer every ForwardBatch until Shutdown."""
    out = Channel(ctx, zmq.PUSH, to_core, bind=False, max_bytes=1 << 30)
    inp = Channel(ctx, zmq.PULL, from_core, bind=False, accept=(ForwardBatch, Shutdown),
                  max_bytes=1 << 30)
    try:
        out.send(WorkerReady(info=runner.info, pid=os.getpid()))
        while True:
            try:
                msg = inp.recv()
            except ProtocolError as e:
                _log(f"dropped a bad frame: {e}")
                continue
            if isinstance(msg, Shutdown):
                return
            out.send(runner.run(msg))
    finally:
        out.close()
        inp.close()
