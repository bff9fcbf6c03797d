"""Checks on a Generate that the protocol decoder cannot make (ranges, emptiness, lengths).

Types, unknown and missing fields are the decoder's job (core.protocol.decode).
Every failure is an InvalidRequest whose message names the field; the frontend answers
it with code 400.
"""
from __future__ import annotations

import math
from typing import Sequence

from core.protocol import Generate, ModelInfo

PRIORITY_RANGE = (-1000, 1000)
SEED_LIMIT = 2 ** 63


class InvalidRequest(ValueError):
    code = 400


def check_params(msg: Generate) -> None:
    """Everything but the prompt's tokens; raises InvalidRequest."""
    if not msg.request_id:
        raise InvalidRequest("request_id must not be empty")
    if not msg.prompt:
        raise InvalidRequest("prompt must not be empty")
    if msg.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {msg.max_tokens}")
    if not math.isfinite(msg.temperature) or msg.temperature < 0:
        raise InvalidRequest(f"temperature must be finite and >= 0, got {msg.temperature}")
    if not 0 < msg.top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {msg.top_p}")
    if msg.top_k < 0:
        raise InvalidRequest(f"top_k must be >= 0, got {msg.top_k}")
    lo, hi = PRIORITY_RANGE
    if not lo <= msg.priority <= hi:
        raise InvalidRequest(f"priority must be in [{lo}, {hi}], got {msg.priority}")
    if msg.seed is not None and not 0 <= msg.seed < SEED_LIMIT:
        raise InvalidRequest(f"seed must be in [0, 2**63), got {msg.seed}")
    if msg.stop is not None and not all(msg.stop):
        raise InvalidRequest("stop strings must not be empty")


def check_prompt_ids(ids: Sequence[int], info: ModelInfo) -> None:
    """The tokenized prompt against the model: non-empty, in the vocabulary, short enough."""
    if not ids:
        raise InvalidRequest("prompt has no tokens")
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(f"prompt token {bad} outside [0, {info.vocab_size})")
    if len(ids) >= info.max_model_len:
        raise InvalidRequest(
            f"prompt of {len(ids)} tokens reaches max_model_len {info.max_model_len}")
