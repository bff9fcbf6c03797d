"""The blocking client of the engine: `Client` (AsyncClient is frontend/client/aio.py).

Imports only the standard library, zmq, msgpack and core.ipc.protocol, so that a client
program stays light. One DEALER socket per client; several requests may be in flight on
it at once (replies are buffered per request id). A Client is not thread-safe.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Iterator

import zmq

from core.ipc.protocol import Abort, Delta, ErrorReply, Generate, Stats, StatsReply, encode
from frontend.client.common import (CLOSE_LINGER_MS, LOST_CONNECTION, ClientError, RequestStream,
                                    Result, as_error, close_dealer, decode_replies,
                                    duplicate_error, embed_inputs, ends, generate_of,
                                    make_embed, open_dealer, settle,
                                    take_disconnects, timeout_error, unreachable_error)
from frontend.client.keys import curve_options


class Client(RequestStream):
    def __init__(self, address: str, timeout: float = 60, *, server_key=None,
                 client_key=None):
        """`server_key` and `client_key`: CURVE (frontend/client/keys.py says which forms
        they take); both or neither."""
        self.address, self.timeout = address, timeout
        options = curve_options(server_key, client_key)   # before a context: may raise
        self._ctx = zmq.Context()
        self._sock, self._monitor = open_dealer(self._ctx, address, CLOSE_LINGER_MS,
                                                 options)
        # a send with no connection to queue on (a refused CURVE handshake) would wait forever
        self._sock.setsockopt(zmq.SNDTIMEO, max(1, round(timeout * 1000)))
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
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
            close_dealer(self._sock, self._monitor)
            self._ctx.term()

    # ------------------------------------------------------------ the API

    def generate(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 stop=None, priority=0, ignore_eos=False, request_id=None, *, logprobs=None,
                 min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                 min_tokens=0, stop_token_ids=None, include_stop_str_in_output=False,
                 skip_special_tokens=True, add_special_tokens=True, user=None,
                 max_tokens_must_fit=False, prompt_logprobs=None, response_format=None,
                 structured_outputs=None, key_hash=None, cache_salt=None,
                 speculative=True) -> Result:
        """The whole answer; stream() (RequestStream) gives it delta by delta."""
        msg = generate_of(locals())
        self._start(msg)
        result = Result(msg.request_id)
        for d in self._deltas(msg.request_id):
            result.add(d)
        return result

    def embed(self, input, *, priority=0, user=None, add_special_tokens=True, cache_salt=None
              ) -> list[float] | list[list[float]]:
        """The embedding of `input` (a string or a list of token ids: one vector), or of
        each input of a batch (a list of strings or of id lists: a list of vectors), all
        sent at once (docs/design/worker.md, "Embeddings"). A refused input raises
        ClientError and the batch's others are aborted."""
        prompts, one = embed_inputs(input)
        msgs = [make_embed(p, priority=priority, user=user,
                           add_special_tokens=add_special_tokens, cache_salt=cache_salt)
                for p in prompts]
        sent, vectors = [], []
        try:
            for msg in msgs:
                self._start(msg)
                sent.append(msg.request_id)
            for request_id in sent:
                vectors.append(self._vector(self._deltas(request_id)))
        finally:
            for request_id in sent[len(vectors) + 1:]:   # never read: abort them here
                if self._buffers.pop(request_id, None) is not None and not self._closed:
                    self._send(Abort(request_id))
        return vectors[0] if one else vectors

    def _vector(self, deltas: Iterator[Delta]) -> list[float]:
        result = Result("")
        for d in deltas:
            result.add(d)
        return result.embedding or []

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
        if take_disconnects(self._monitor):
            # a disconnect seen before this request is registered fails those sent before
            # it only: this one waits in zmq for the reconnect
            self._lost()
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
        ready = dict(self._poller.poll(int(left * 1000) + 1)) if left > 0 else {}
        if not ready:
            raise timeout_error(self.timeout)
        if self._monitor in ready and take_disconnects(self._monitor):
            self._lost()
        self._take_replies()

    def _take_replies(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            for reply in decode_replies(frames):
                self._dispatch(reply)

    def _lost(self) -> None:
        """The replies that arrived before a disconnect first: a final reply the frontend
        sent just before it died is the request's answer, not a loss."""
        self._take_replies()
        self._fail_all(ErrorReply(None, 503, LOST_CONNECTION))

    def _dispatch(self, reply) -> None:
        if isinstance(reply, (Delta, ErrorReply)) and reply.request_id in self._buffers:
            self._buffers[reply.request_id].append(reply)
        elif isinstance(reply, StatsReply) or (isinstance(reply, ErrorReply)
                                                and reply.request_id is None):
            self._stats.append(reply)
        # anything else: heartbeats, replies to abandoned requests

    def _fail_all(self, err: ErrorReply) -> None:
        for request_id, queue in self._buffers.items():
            if not queue or not ends(queue[-1]):
                queue.append(ErrorReply(request_id, err.code, err.message))
        self._stats.append(err)

    def _send(self, msg) -> None:
        if self._closed:
            raise ClientError(503, "the client is closed")
        try:
            self._sock.send(encode(msg))
        except zmq.Again:
            raise unreachable_error(self.timeout) from None
