"""scripts/bench overhead's two ways of sending a run's requests and reading every reply:
the raw DEALER `sink` (the measuring instrument) and `AsyncClient` (the client library,
whose own cost and pace are measured). Both count the deltas they have read in `Received`,
which the CPU sampler reads while they run (scripts/benchmarks/_overhead_cpu.py)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class Received:
    deltas: int = 0               # read so far (the sampler reads it from its thread)
    tokens: int = 0
    last_t: float = 0.0           # time.time() of the last delta read
    errors: list[str] = field(default_factory=list)   # AsyncClient: each failed stream's error


def sink(address: str, reqs, timeout: float = 300, bar=None,
         received: Received | None = None) -> tuple[float, int]:
    """Send every request at once on a raw DEALER and read every reply to the end:
    (wall seconds, output tokens). A measuring instrument, not the client library: its
    receive queue is unbounded (RCVHWM 0), so it never falls behind at the zmq level,
    and it does little per delta: it drains what has arrived after each poll and reads
    the frames as plain msgpack maps (the protocol's checked decode took 6.9 us a frame,
    this 2.0): on 2 cores, every cycle it spends is taken from the group it measures."""
    import msgpack
    import zmq

    from core.ipc.protocol import WIRE, Deltas, ErrorReply, Generate, encode
    got = received if received is not None else Received()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        t0 = time.perf_counter()
        for i, r in enumerate(reqs):
            sock.send(encode(Generate(request_id=f"o{i}", prompt=r.prompt,
                                      max_tokens=r.max_tokens, ignore_eos=True,
                                      wire=WIRE)))
        left, tokens = len(reqs), 0
        unpack, recv, again = msgpack.unpackb, sock.recv, zmq.Again
        while left:
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError(f"no reply within {timeout}s; {left} requests unfinished")
            while left:
                try:
                    msg = unpack(recv(zmq.NOBLOCK))
                except again:
                    break
                if msg["t"] == ErrorReply.TAG:
                    raise RuntimeError(f"request {msg['request_id']}: {msg['code']}"
                                       f" {msg['message']}")
                if msg["t"] == Deltas.TAG:   # the columns' deltas, then the full ones
                    got.deltas += len(msg["request_ids"]) + len(msg["full"])
                    tokens += len(msg["tokens"]) // 4
                    for d in msg["full"]:
                        tokens += len(d["token_ids"])
                        if d["finish_reason"] is not None:
                            left -= 1
                            if bar is not None:
                                bar.tick()
        got.tokens, got.last_t = tokens, time.time()
        return time.perf_counter() - t0, tokens
    finally:
        sock.close()
        ctx.term()


def streams(address: str, reqs, received: Received, timeout: float = 300,
            bar=None) -> tuple[float, int]:
    """Every request as its own AsyncClient.stream() on one client, all in flight at
    once, each delta read as an application would: (wall seconds, output tokens). A stream
    that fails (the frontend dropped the client: 503) is counted in `received.errors`."""
    return asyncio.run(_streams(address, reqs, received, timeout, bar))


async def _streams(address: str, reqs, got: Received, timeout: float, bar) -> tuple[float, int]:
    from frontend.client.aio import AsyncClient
    from frontend.client.common import ClientError

    async def one(client: AsyncClient, i: int, r) -> None:
        try:
            async for d in client.stream(r.prompt, r.max_tokens, ignore_eos=True,
                                         request_id=f"c{i}"):
                got.deltas += 1
                got.tokens += len(d.token_ids)
        except ClientError as e:
            got.errors.append(f"{e.code} {e.message}")
        got.last_t = time.time()
        if bar is not None:
            bar.tick()

    async with AsyncClient(address, timeout=timeout) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i, r) for i, r in enumerate(reqs)))
        return time.perf_counter() - t0, got.tokens
