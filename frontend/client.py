"""The Python client of the engine: `Client` (blocking) and `AsyncClient` (asyncio).

Imports only the standard library, zmq, msgpack and core.protocol, so that a client
program stays light. One DEALER socket per client; several requests may be in flight on
it at once (replies are buffered per request id). A Client is not thread-safe.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Iterator

import zmq

from core.protocol import Abort, Delta, ErrorReply, Generate, Stats, StatsReply, encode
from frontend.async_client import AsyncClient
from frontend.client_base import (ClientError, Result, as_error, decode_reply, ends, settle,
                                  duplicate_error, make_generate, timeout_error)

__all__ = ["AsyncClient", "Client", "ClientError", "Result"]

CLOSE_LINGER_MS = 250  # a last Abort still leaves when the client closes right after it


class Client:
    def __init__(self, address: str, timeout: float = 60):
        self.address, self.timeout = address, timeout
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
        # Unbounded receive queue: a client busy elsewhere for a while must not stall
        # zmq's reads (and heartbeats), or the frontend takes it for gone.
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.connect(address)
        self._buffers: dict[str, deque] = {}
        self._stats: deque = deque()
        self._closed = False

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()
            self._ctx.term()

    # ------------------------------------------------------------ the API

    def generate(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0,
                 seed=None, stop=None, priority=0, ignore_eos=False,
                 request_id=None) -> Result:
        msg = make_generate(prompt, max_tokens, temperature, top_p, top_k, seed, stop,
                            priority, ignore_eos, request_id)
        self._start(msg)
        result = Result(msg.request_id)
        for d in self._deltas(msg.request_id):
            result.add(d)
        return result

    def stream(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0,
               seed=None, stop=None, priority=0, ignore_eos=False,
               request_id=None) -> Iterator[Delta]:
        """Deltas as they come. The request is sent when iteration starts; closing or
        dropping the iterator before the last delta aborts it."""
        msg = make_generate(prompt, max_tokens, temperature, top_p, top_k, seed, stop,
                            priority, ignore_eos, request_id)
        return self._stream(msg)

    def abort(self, request_id: str) -> None:
        """Ask the engine to stop a request; its stream ends with finish_reason "abort"."""
        self._send(Abort(request_id))

    def stats(self) -> dict:
        self._stats.clear()  # a late answer to an earlier, timed-out call
        self._send(Stats())
        deadline = time.monotonic() + self.timeout
        while not self._stats:
            self._wait(deadline)
        reply = self._stats.popleft()
        if isinstance(reply, ErrorReply):
            raise as_error(reply)
        return reply.stats

    # ------------------------------------------------------------ plumbing

    def _stream(self, msg: Generate) -> Iterator[Delta]:
        self._start(msg)
        yield from self._deltas(msg.request_id)

    def _start(self, msg: Generate) -> None:
        if msg.request_id in self._buffers:
            raise duplicate_error(msg.request_id)
        self._buffers[msg.request_id] = deque()
        try:
            self._send(msg)
        except BaseException:
            del self._buffers[msg.request_id]
            raise

    def _deltas(self, request_id: str) -> Iterator[Delta]:
        """The request's deltas up to the last; aborts it if left before that."""
        done = False
        try:
            while not done:
                item = self._next(request_id)
                done = ends(item)
                yield settle(item)
        finally:
            self._buffers.pop(request_id, None)
            if not done and not self._closed:
                self._send(Abort(request_id))

    def _next(self, request_id: str):
        queue = self._buffers[request_id]
        deadline = time.monotonic() + self.timeout
        while not queue:
            self._wait(deadline)
        return queue.popleft()

    def _wait(self, deadline: float) -> None:
        """Read what arrives before `deadline`; ClientError(503) when nothing does."""
        left = deadline - time.monotonic()
        if left <= 0 or not self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
            raise timeout_error(self.timeout)
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._dispatch(decode_reply(frames))

    def _dispatch(self, reply) -> None:
        if isinstance(reply, (Delta, ErrorReply)) and reply.request_id in self._buffers:
            self._buffers[reply.request_id].append(reply)
        elif isinstance(reply, StatsReply) or (isinstance(reply, ErrorReply)
                                                and reply.request_id is None):
            self._stats.append(reply)
        # anything else: heartbeats, replies to abandoned requests

    def _send(self, msg) -> None:
        if self._closed:
            raise ClientError(503, "the client is closed")
        self._sock.send(encode(msg))
