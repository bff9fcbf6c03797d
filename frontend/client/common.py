"""What Client and AsyncClient share: errors, results, building requests, reading replies.

Imports only the standard library, msgpack (through core.ipc.protocol) and core.ipc.protocol.
"""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from core.ipc.protocol import (WIRE, Delta, Deltas, ErrorReply, Generate, Pong, ProtocolError,
                               StatsReply, decode)

REPLY_TYPES = (Deltas, ErrorReply, StatsReply, Pong)
CLOSE_LINGER_MS = 250  # a last Abort still leaves when the client closes right after it
# Replies come from the engine we asked; their size is bounded by the prompt we sent.
MAX_REPLY_BYTES = 1 << 30


class ClientError(Exception):
    """An error answer from the engine, or no answer: code 400, 403, 413, 429 or 503."""

    def __init__(self, code: int, message: str, param: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.param = param   # a 400's field at fault, where the engine names one


@dataclass
class Result:
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[float] | None = None            # with logprobs=N: one per token_ids entry
    top_logprobs: list[dict[int, float]] | None = None
    metrics: dict | None = None                    # on a finished request (docs/design/worker.md#request-metrics)
    cached_tokens: int = 0                         # prompt tokens the prefix cache served
    # with prompt_logprobs=N: None, then per prompt position {token id: logprob} holding
    # the prompt's token and the top N (vLLM's shape, without Logprob objects)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    embedding: list[float] | None = None           # an embed request's vector

    def add(self, d: Delta) -> None:
        self.text += d.text
        self.token_ids.extend(d.token_ids)
        if d.prompt_token_ids is not None:
            self.prompt_token_ids = list(d.prompt_token_ids)
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = prompt_dicts(d)
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(d.logprobs)
            self.top_logprobs = (self.top_logprobs or []) + top_dicts(d)
        if d.metrics is not None:
            self.metrics = dict(d.metrics)
            self.cached_tokens = self.metrics.get("cached_tokens") or 0
        if d.embedding is not None:
            self.embedding = list(d.embedding)
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason


def embed_inputs(input) -> tuple[list, bool]:
    """embed()'s `input` as a list of prompts, and whether it was one: a string or a list
    of token ids is one input; a list of strings or of id lists is a batch."""
    if isinstance(input, str):
        return [input], True
    items = list(input)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [items], True
    return [x if isinstance(x, str) else list(x) for x in items], False


def make_embed(prompt, request_id=None, *, priority=0, user=None, add_special_tokens=True,
               key_hash=None, cache_salt=None) -> Generate:
    """One embedding request (docs/design/worker.md, "Embeddings"): prefill only, pooled."""
    return Generate(uuid.uuid4().hex if request_id is None else request_id,
                    prompt if isinstance(prompt, str) else list(prompt), max_tokens=1,
                    priority=priority, user=user, add_special_tokens=add_special_tokens,
                    key_hash=key_hash, cache_salt=cache_salt, wire=WIRE, embed=True)


def top_dicts(d: Delta) -> list[dict[int, float]]:
    """The delta's top alternatives, one {token id: logprob} per token (the wire carries
    [[id, logprob], ...] pairs: msgpack maps with int keys are refused)."""
    return [{int(t): float(lp) for t, lp in pairs or ()} for pairs in d.top_logprobs or ()]


def prompt_dicts(d: Delta) -> list[dict[int, float] | None]:
    """The delta's prompt logprobs as {token id: logprob} per position (None at position
    0): the prompt's own token first, then its top alternatives."""
    out: list[dict[int, float] | None] = []
    for tok, e in zip(d.prompt_token_ids or (), d.prompt_logprobs):
        if e is None:
            out.append(None)
            continue
        lp, _, top = e
        out.append({int(tok): float(lp), **{int(t): float(x) for t, x in top}})
    return out


def make_generate(prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                  stop=None, priority=0, ignore_eos=False, request_id=None, *,
                  logprobs=None, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                  repetition_penalty=1.0, min_tokens=0, stop_token_ids=None,
                  include_stop_str_in_output=False, skip_special_tokens=True,
                  add_special_tokens=True, user=None, max_tokens_must_fit=False,
                  prompt_logprobs=None, response_format=None,
                  structured_outputs=None, key_hash=None, cache_salt=None,
                  speculative=True) -> Generate:
    """The request a generate() or stream() call asks for, with those methods' parameters
    (README's API table says what each does)."""
    if isinstance(stop, str):
        stop = [stop]
    elif stop is not None:
        stop = list(stop)
    if not isinstance(prompt, str):
        prompt = list(prompt)
    if stop_token_ids is not None:
        stop_token_ids = list(stop_token_ids)
    return Generate(uuid.uuid4().hex if request_id is None else request_id, prompt,
                    max_tokens, temperature, top_p, top_k, seed, stop, priority, ignore_eos,
                    logprobs, min_p, presence_penalty, frequency_penalty, repetition_penalty,
                    min_tokens, stop_token_ids, include_stop_str_in_output,
                    skip_special_tokens, add_special_tokens, user, max_tokens_must_fit,
                    prompt_logprobs, response_format, structured_outputs, key_hash,
                    cache_salt, speculative, wire=WIRE)


def generate_of(call: dict) -> Generate:
    """The Generate of a generate() or stream() call, from its locals() (its parameters)."""
    return make_generate(**{k: v for k, v in call.items() if k != "self"})


class RequestStream:
    """stream(), as Client and AsyncClient both define it over their own `_stream(msg)`.
    Its parameters, and each client's generate()'s, are make_generate's (tests/
    test_client_api.py holds all four to the pinned list)."""

    def stream(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, seed=None,
               stop=None, priority=0, ignore_eos=False, request_id=None, *, logprobs=None,
               min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
               min_tokens=0, stop_token_ids=None, include_stop_str_in_output=False,
               skip_special_tokens=True, add_special_tokens=True, user=None,
               max_tokens_must_fit=False,
               prompt_logprobs=None, response_format=None, structured_outputs=None,
               key_hash=None, cache_salt=None,
               speculative=True) -> Iterator[Delta] | AsyncIterator[Delta]:
        """Deltas as they come: `for d in client.stream(...)`, `async for` on an AsyncClient.
        The request is sent when iteration starts; closing or dropping the iterator before
        the last delta aborts it."""
        return self._stream(generate_of(locals()))


LOST_CONNECTION = ("lost the connection to the engine's frontend (it died, or dropped this "
                   "client); the request's fate is unknown")


def open_dealer(ctx, address: str, linger_ms: int, options: dict[int, bytes] | None = None):
    """The client's socket and a monitor of its disconnects.

    A fixed routing id lets a reconnect keep the client's identity at the frontend. The
    monitor is how a client learns that the frontend died: its requests then fail with 503
    at once instead of at their timeout."""
    import zmq
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
    # Unbounded receive queue: a client busy elsewhere for a while must not stall zmq's
    # reads (and heartbeats), or the frontend takes it for gone.
    sock.setsockopt(zmq.RCVHWM, 0)
    for opt, value in (options or {}).items():   # CURVE (frontend/client/keys.py)
        sock.setsockopt(opt, value)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    return sock, monitor


def take_disconnects(monitor) -> bool:
    """Take every event a (plain, not asyncio) monitor socket holds; True if any came (each
    is a disconnect)."""
    import zmq
    seen = False
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
            seen = True
        except zmq.Again:
            return seen


def close_dealer(sock, monitor) -> None:
    sock.disable_monitor()
    monitor.close(0)
    sock.close()


def decode_replies(frames: list[bytes]) -> list:
    """The replies in `frames`, a Deltas frame's one Delta per request; none for a frame
    this client cannot read (dropped)."""
    if len(frames) != 1:
        return []
    try:
        reply = decode(frames[0], REPLY_TYPES, MAX_REPLY_BYTES)
        return reply.unpack() if isinstance(reply, Deltas) else [reply]
    except ProtocolError:
        return []


def ends(item) -> bool:
    """True for a request's last reply: an error, or the delta with a finish reason."""
    return isinstance(item, ErrorReply) or item.finish_reason is not None


def settle(item) -> Delta:
    """The delta itself, or ClientError for an error reply."""
    if isinstance(item, ErrorReply):
        raise as_error(item)
    return item


def as_error(reply: ErrorReply) -> ClientError:
    return ClientError(reply.code, reply.message, reply.param)


def timeout_error(timeout: float) -> ClientError:
    return ClientError(503, f"no reply from the engine within {timeout:g} s")


def unreachable_error(timeout: float) -> ClientError:
    """A request zmq could not queue within the timeout: no connection to the frontend
    (a CURVE handshake it refused leaves none)."""
    return ClientError(503, f"cannot reach the engine within {timeout:g} s (no connection)")


def duplicate_error(request_id: str) -> ClientError:
    return ClientError(400, f"request_id {request_id!r} is already in flight on this client")
