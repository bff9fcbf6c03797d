"""AsyncClient: the Client's API as coroutines, for many concurrent requests on one socket.

One background reader task receives every reply and hands it to the queue of its request
(or to the oldest stats() call waiting); each call awaits only its own queue. A stream's
wait for its next reply is timed by one clock task for all of them (_clock_loop), not a
timer each: with 1,000 streams, arming and cancelling a timer per delta was a third of the
client's work on it.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import AsyncIterator

import zmq
import zmq.asyncio

from core.ipc.protocol import Abort, Delta, ErrorReply, Generate, Stats, StatsReply, encode
from frontend.client.common import (CLOSE_LINGER_MS, LOST_CONNECTION, ClientError, RequestStream,
                                    Result, as_error, close_dealer, decode_replies,
                                    duplicate_error, embed_inputs, ends, generate_of,
                                    make_embed, open_dealer, settle,
                                    take_disconnects, timeout_error, unreachable_error)
from frontend.client.keys import curve_options


# replies read in one go before the reader lets the streams run (_read_loop)
READ_BURST = 64
TIMED_OUT = object()   # put in a stream's queue by _clock_loop: its wait ran past the timeout


class AsyncClient(RequestStream):
    def __init__(self, address: str, timeout: float = 60, *, server_key=None,
                 client_key=None):
        """`server_key` and `client_key`: CURVE (frontend/client/keys.py says which forms
        they take); both or neither."""
        self.address, self.timeout = address, timeout
        options = curve_options(server_key, client_key)   # before a context: may raise
        self._ctx = zmq.asyncio.Context()
        self._sock, self._monitor = open_dealer(self._ctx, address, CLOSE_LINGER_MS,
                                                 options)
        self._monitor_now = zmq.Socket.shadow(self._monitor.underlying)  # polls without a loop
        self._sock_now = zmq.Socket.shadow(self._sock.underlying)   # reads without a loop
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats_waiters: deque[asyncio.Future] = deque()
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._clock: asyncio.Task | None = None
        self._waiting: dict[asyncio.Queue, float] = {}   # a stream's queue -> its deadline
        self._closed = False

    @property
    def inflight(self) -> int:
        """Requests started on this client that have not ended yet."""
        return len(self._queues)

    async def __aenter__(self) -> "AsyncClient":
        self._ensure_reader()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in (self._reader, self._watcher, self._clock) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in self._queues.values():
            q.put_nowait(ErrorReply(None, 503, "the client is closed"))
        for fut in self._stats_waiters:
            if not fut.done():
                fut.set_exception(ClientError(503, "the client is closed"))
        close_dealer(self._sock, self._monitor)
        self._ctx.term()

    # ------------------------------------------------------------ the API

    async def generate(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                       stop=None, priority=0, ignore_eos=False, request_id=None, *, logprobs=None,
                       min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                       repetition_penalty=1.0, min_tokens=0, stop_token_ids=None,
                       include_stop_str_in_output=False, skip_special_tokens=True,
                       add_special_tokens=True, user=None, max_tokens_must_fit=False,
                       prompt_logprobs=None, response_format=None,
                       structured_outputs=None, key_hash=None, cache_salt=None,
                       speculative=True) -> Result:
        """The whole answer; stream() (RequestStream) gives it delta by delta."""
        msg = generate_of(locals())
        result = Result(msg.request_id)
        async for d in self._stream(msg):
            result.add(d)
        return result

    async def embed(self, input, *, priority=0, user=None, add_special_tokens=True,
                    cache_salt=None) -> list[float] | list[list[float]]:
        """As Client.embed: one vector for a string or an id list, a list for a batch."""
        prompts, one = embed_inputs(input)
        kw = {"priority": priority, "user": user, "add_special_tokens": add_special_tokens,
              "cache_salt": cache_salt}
        tasks = [asyncio.ensure_future(self._embedding(p, kw)) for p in prompts]
        try:
            vectors = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()   # a refused input: the others are aborted
            await asyncio.gather(*tasks, return_exceptions=True)
        return vectors[0] if one else list(vectors)

    async def _embedding(self, prompt, kw: dict) -> list[float]:
        result = Result("")
        async for d in self.embed_stream(prompt, **kw):
            result.add(d)
        return result.embedding or []

    def embed_stream(self, prompt, request_id=None, *, priority=0, user=None,
                     add_special_tokens=True, key_hash=None, cache_salt=None
                     ) -> AsyncIterator[Delta]:
        """One input's embedding request as its deltas (one, the final, with `embedding`
        and `prompt_token_ids`): what the gateway's /v1/embeddings fans out."""
        return self._stream(make_embed(prompt, request_id, priority=priority, user=user,
                                       add_special_tokens=add_special_tokens,
                                       key_hash=key_hash, cache_salt=cache_salt))

    async def abort(self, request_id: str) -> None:
        await self._send(Abort(request_id))

    async def stats(self) -> dict:
        fut = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(fut)
        try:
            await self._send(Stats())
            async with asyncio.timeout(self.timeout):
                reply = await asyncio.shield(fut)
        except TimeoutError:
            raise timeout_error(self.timeout) from None
        finally:
            if fut in self._stats_waiters:
                self._stats_waiters.remove(fut)
        if isinstance(reply, ErrorReply):
            raise as_error(reply)
        return reply.stats

    # ------------------------------------------------------------ plumbing

    async def _stream(self, msg: Generate) -> AsyncIterator[Delta]:
        request_id = msg.request_id
        if request_id in self._queues:
            raise duplicate_error(request_id)
        await self._take_disconnects()
        queue = self._queues[request_id] = asyncio.Queue()
        done = False
        try:
            await self._send(msg)
            while not done:
                item = await self._next(queue)
                done = ends(item)
                yield settle(item)
        finally:
            if self._queues.get(request_id) is queue:  # else its final reply came (_dispatch)
                del self._queues[request_id]
            if not done and not self._closed:
                await self._send(Abort(request_id))

    async def _next(self, queue: asyncio.Queue):
        """The stream's next reply; ClientError(503) when none comes within the timeout
        (not asyncio.wait_for: on Python 3.11 it swallows a cancel that lands once the
        queue has handed over an item, and a stream whose HTTP client left would then run
        to its end unaborted; a plain await passes every cancel on)."""
        if queue.empty():
            self._waiting[queue] = time.monotonic() + self.timeout
            try:
                item = await queue.get()
            finally:
                self._waiting.pop(queue, None)
        else:
            item = queue.get_nowait()
        if item is TIMED_OUT:
            raise timeout_error(self.timeout)
        return item

    async def _clock_loop(self) -> None:
        """Wake each stream whose wait passed its deadline, within a quarter of the
        timeout (a second at most) after it."""
        tick = min(1.0, self.timeout / 4)
        while True:
            await asyncio.sleep(tick)
            self._wake_late(time.monotonic())

    def _wake_late(self, now: float) -> None:
        for q in [q for q, deadline in self._waiting.items() if deadline <= now]:
            del self._waiting[q]
            if q.empty():   # else a reply wakes it already: no stale marker left
                q.put_nowait(TIMED_OUT)

    async def _send(self, msg) -> None:
        if self._closed:
            raise ClientError(503, "the client is closed")
        self._ensure_reader()
        try:   # zmq waits for a connection to queue on; a refused CURVE handshake leaves none
            async with asyncio.timeout(self.timeout):
                await self._sock.send(encode(msg))
        except TimeoutError:
            raise unreachable_error(self.timeout) from None

    def _ensure_reader(self) -> None:
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read_loop())
            self._watcher = loop.create_task(self._watch_loop())
            self._clock = loop.create_task(self._clock_loop())

    async def _watch_loop(self) -> None:
        """Each disconnect fails every request in flight with 503 (see open_dealer). It
        polls and does not receive: whoever takes an event from the monitor handles it in
        the same breath (_take_disconnects), so no event can sit taken but unhandled."""
        while True:
            await self._monitor.poll()
            await self._take_disconnects()

    async def _take_disconnects(self) -> None:
        """Handle every disconnect zmq has reported so far. Called before a new request is
        registered too: a Generate sent after a disconnect waits in zmq for the reconnect
        and reaches the next frontend, so that disconnect's 503s must not take it (the
        watcher alone may run late on a busy loop)."""
        if not self._monitor_now.poll(0):
            return
        await asyncio.sleep(0)   # the reader takes a reply it has already received
        if take_disconnects(self._monitor_now):
            self._lost()

    def _lost(self) -> None:
        """Fail what is in flight with 503 once the replies that arrived before the
        disconnect are dispatched: a final reply the frontend sent just before it died is
        the request's answer, not a loss."""
        while True:
            try:
                # a non-blocking receive on a zmq.asyncio socket completes at once
                frames = self._sock.recv_multipart(zmq.NOBLOCK).result()
            except zmq.Again:
                break
            self._take(frames)
        self._fail_all(ErrorReply(None, 503, LOST_CONNECTION))

    def _fail_all(self, err: ErrorReply) -> None:
        """Each stream in flight gets `err` as its last reply and leaves `_queues`, as a
        final from the frontend would make it (_dispatch): a reply that comes for it later
        (its Generate served by the next frontend, see _take_disconnects) or a second
        disconnect finds no stream to reach."""
        failed, self._queues = self._queues, {}
        for request_id, q in failed.items():
            q.put_nowait(ErrorReply(request_id, err.code, err.message))
        while self._stats_waiters:
            fut = self._stats_waiters.popleft()
            if not fut.done():
                fut.set_result(err)

    async def _read_loop(self) -> None:
        """Awaiting a reply that has arrived does not yield, so while replies keep coming
        a reader that only awaited would never let the streams read their queues (1,000
        streams read nothing until the frontend went quiet): what has arrived is read
        without waiting, READ_BURST at most, then the loop runs the streams."""
        now = self._sock_now
        while True:
            self._take(await self._sock.recv_multipart())
            for _ in range(READ_BURST - 1):
                try:
                    frames = now.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(frames)
            await asyncio.sleep(0)

    def _take(self, frames: list[bytes]) -> None:
        for reply in decode_replies(frames):
            self._dispatch(reply)

    def _dispatch(self, reply) -> None:
        if isinstance(reply, (Delta, ErrorReply)) and reply.request_id in self._queues:
            # a request whose last reply is queued is no longer in flight: a later
            # disconnect must not queue it a second one (_fail_all)
            queue = self._queues[reply.request_id]
            if ends(reply):
                del self._queues[reply.request_id]
            queue.put_nowait(reply)
        elif isinstance(reply, StatsReply) or (isinstance(reply, ErrorReply)
                                                and reply.request_id is None):
            while self._stats_waiters:
                fut = self._stats_waiters.popleft()
                if not fut.done():
                    fut.set_result(reply)
                    break
        # anything else: heartbeats, replies to abandoned requests
