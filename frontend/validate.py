"""Checks on a Generate that the protocol decoder cannot make (ranges, emptiness, lengths).

Types, unknown and missing fields are the decoder's job (core.ipc.protocol.decode).
Every failure is an InvalidField whose message and `field` name the field; the frontend
answers it with code 400, the gateway with its own 400 (param = field). The bounds are in
core/bounds.py.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

from core.ipc.protocol import WIRE, Generate, ModelInfo
from core.bounds import (INT32_MAX, MAX_CACHE_SALT_CHARS, MAX_KEY_HASH_CHARS,
                             MAX_LOGPROBS, MAX_PENALTY, MAX_PRIORITY, MAX_REPETITION_PENALTY,
                             MAX_REQUEST_ID_CHARS, MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS, MAX_STOPS,
                             MAX_TEMPERATURE, MAX_USER_CHARS, MIN_TEMPERATURE, SEED_LIMIT)

_KEY_HASH = re.compile(f"[0-9a-f]{{1,{MAX_KEY_HASH_CHARS}}}")


class InvalidField(ValueError):
    """A field out of its bounds: 400 naming it (the scheduler's own refusal of bad
    arguments is core.sched_types.InvalidRequest)."""
    code = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_params(msg: Generate, info: ModelInfo | None = None) -> None:
    """Everything but the prompt's tokens; raises InvalidField. Without `info` the
    model's bounds (max_model_len, vocab_size) give way to the wire types' bounds."""
    if msg.wire != WIRE:
        raise InvalidField(f"this engine speaks wire {WIRE} (one Deltas frame per client per "
                           f"step) and the client wire {msg.wire}: use the client of the "
                           "engine's version", "wire")
    if not msg.request_id:
        raise InvalidField("request_id must not be empty", "request_id")
    if len(msg.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidField(f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, "
                             f"got {len(msg.request_id)}", "request_id")
    if not msg.prompt:
        raise InvalidField("prompt must not be empty", "prompt")
    check_fields(msg, info.max_model_len if info else None, info.vocab_size if info else None)
    if msg.embed:
        check_embed(msg)


# What an embedding has no use for (it samples nothing), each refused by name.
NOT_FOR_EMBED = ("logprobs", "prompt_logprobs", "response_format", "structured_outputs", "stop",
                 "stop_token_ids")


def check_embed(msg: Generate) -> None:
    """An embed request (docs/design/worker.md, "Embeddings"): one pooled position, no
    sampling: max_tokens 1 and none of the fields only a generation reads."""
    if msg.max_tokens != 1:
        raise InvalidField("an embedding generates nothing: max_tokens must be 1", "max_tokens")
    for name in NOT_FOR_EMBED:
        if getattr(msg, name) is not None:
            raise InvalidField(f"an embedding samples nothing: {name} must be unset", name)


def check_fields(req, max_model_len: int | None = None, vocab_size: int | None = None) -> None:
    """The sampling and scheduling fields of `req`: a Generate (or anything with its
    attributes)."""
    _int_in("max_tokens", req.max_tokens, 1, max_model_len or INT32_MAX)
    _temperature(req.temperature)
    if not 0 < req.top_p <= 1:  # NaN fails too
        raise InvalidField(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    _int_in("top_k", req.top_k, 0, INT32_MAX if vocab_size is None else vocab_size)
    _int_in("priority", req.priority, -MAX_PRIORITY, MAX_PRIORITY)
    if req.seed is not None:
        _int_in("seed", req.seed, 0, SEED_LIMIT - 1)
    if req.stop is not None:
        _stops(req.stop)
    _processors(req, vocab_size)
    _cache_salt(getattr(req, "cache_salt", None))
    if type(getattr(req, "speculative", True)) is not bool:
        raise InvalidField("speculative must be true or false", "speculative")


def _processors(req, vocab_size: int | None) -> None:
    if req.logprobs is not None:
        _int_in("logprobs", req.logprobs, 0, MAX_LOGPROBS)
    if getattr(req, "prompt_logprobs", None) is not None:
        _int_in("prompt_logprobs", req.prompt_logprobs, 0, MAX_LOGPROBS)
    _real_in("min_p", req.min_p, 0.0, 1.0)
    _real_in("presence_penalty", req.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
    _real_in("frequency_penalty", req.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
    if not 0 < req.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise InvalidField(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], "
                             f"got {req.repetition_penalty}", "repetition_penalty")
    _int_in("min_tokens", req.min_tokens, 0, req.max_tokens)
    ids = req.stop_token_ids or ()
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidField(f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, "
                             f"got {len(ids)}", "stop_token_ids")
    for t in ids:
        _int_in("stop_token_ids", t, 0, (vocab_size or INT32_MAX + 1) - 1)
    if req.user is not None and len(req.user) > MAX_USER_CHARS:
        raise InvalidField(f"user must be at most {MAX_USER_CHARS} characters", "user")
    key_hash = req.key_hash
    if key_hash is not None and not _KEY_HASH.fullmatch(key_hash):
        raise InvalidField(f"key_hash must be 1 to {MAX_KEY_HASH_CHARS} lower-case hex digits",
                           "key_hash")


def _cache_salt(salt: str | None) -> None:
    if salt is not None and not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
        raise InvalidField(f"cache_salt must be a non-empty string of at most "
                           f"{MAX_CACHE_SALT_CHARS} characters", "cache_salt")


def _real_in(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:  # NaN fails too
        raise InvalidField(f"{name} must be in [{lo:g}, {hi:g}], got {value}", name)


def _int_in(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise InvalidField(f"{name} must be in [{lo}, {hi}], got {value!r:.40}", name)


def _temperature(t: float) -> None:
    if t == 0 or (math.isfinite(t) and MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
        return
    raise InvalidField(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                         f"{MAX_TEMPERATURE:g}], got {t}", "temperature")


def _stops(stop: Sequence[str]) -> None:
    if len(stop) > MAX_STOPS:
        raise InvalidField(f"stop must hold at most {MAX_STOPS} strings, got {len(stop)}",
                             "stop")
    if not all(stop):
        raise InvalidField("stop strings must not be empty", "stop")
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_CHARS:
        raise InvalidField(f"each stop string must be at most {MAX_STOP_CHARS} characters, "
                             f"got one of {longest}", "stop")


def check_prompt_ids(ids: Sequence[int], info: ModelInfo, max_tokens: int | None = None) -> None:
    """The tokenized prompt against the model: non-empty, in the vocabulary, short enough;
    with `max_tokens` (a request whose max_tokens must fit), short enough for those too."""
    if not ids:
        raise InvalidField("prompt has no tokens", "prompt")
    if len(ids) >= info.max_model_len:
        raise InvalidField(
            f"prompt of {len(ids)} tokens reaches max_model_len {info.max_model_len}", "prompt")
    if max_tokens is not None and len(ids) + max_tokens > info.max_model_len:
        raise InvalidField(
            f"prompt of {len(ids)} tokens + max_tokens {max_tokens} = {len(ids) + max_tokens} "
            f"tokens, over max_model_len {info.max_model_len}", "max_tokens")
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise InvalidField(f"prompt token {bad} outside [0, {info.vocab_size})", "prompt")
