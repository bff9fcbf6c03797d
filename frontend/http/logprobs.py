"""Logprobs in OpenAI's shapes, from the engine's (Delta.logprobs: the chosen token's,
Delta.top_logprobs: [[token id, logprob], ...] best first, per token).

A token's string is that token decoded alone with the served tokenizer (Tokens.piece);
chat's `bytes` are that string's UTF-8 bytes. -inf (a token sampling could never pick) is
sent as -9999.0, as vLLM does: JSON has no infinities.
"""
from __future__ import annotations

import math

from frontend.http.tokens import Tokens

# (token id, logprob, top alternatives); an echoed prompt's first token: (id, None, None)
Entry = tuple[int, float | None, list[tuple[int, float]] | None]
FLOOR = -9999.0


def entries(d) -> list[Entry]:
    """The delta's tokens with their logprobs; [] when logprobs were not asked."""
    if d.logprobs is None:
        return []
    tops = d.top_logprobs or [()] * len(d.logprobs)
    return [(int(t), _finite(lp), [(int(a), _finite(b)) for a, b in top or ()])
            for t, lp, top in zip(d.token_ids, d.logprobs, tops)]


def _finite(lp) -> float:
    lp = float(lp)
    return lp if math.isfinite(lp) else FLOOR


def completion(tokens: Tokens, got: list[Entry], offset: int) -> tuple[dict, int]:
    """Completions' choice.logprobs, and the text offset after these tokens."""
    strs = [tokens.piece(t) for t, _, _ in got]
    offsets = []
    for s in strs:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": strs, "token_logprobs": [lp for _, lp, _ in got],
            "top_logprobs": [None if top is None else {tokens.piece(a): b for a, b in top}
                             for _, _, top in got],   # None: an echoed prompt's first token
            "text_offset": offsets}, offset


def chat(tokens: Tokens, got: list[Entry]) -> dict:
    """Chat's choice.logprobs."""
    return {"content": [{**_token(tokens, t, lp),
                         "top_logprobs": [_token(tokens, a, b) for a, b in top]}
                        for t, lp, top in got],
            "refusal": None}


def _token(tokens: Tokens, token_id: int, logprob: float) -> dict:
    s = tokens.piece(token_id)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode())}
