"""The bound on one reply's logprobs: max_tokens x n x (1 + top alternatives) entries.

A whole (non-streamed) reply is built in the gateway's memory, and each choice's Tally
keeps every token's logprobs until the end, streamed or not: one chat with n=16,
top_logprobs=20 and no max_tokens (2,048 tokens of context) is ~690,000 entries, a 68 MB
JSON reply and several times that in Python objects while it is built. A body whose
worst case passes MAX_REPLY_ENTRIES is refused before any engine request starts. Without
logprobs a reply is text only (n x max_tokens tokens of it), so no bound applies.
"""
from __future__ import annotations

from frontend.http.errors import ApiError

MAX_REPLY_ENTRIES = 1 << 17   # ~100 bytes of JSON each: a reply of at most ~13 MB


def check_reply_size(max_tokens: int, n: int, logprobs: int | None, param: str) -> None:
    """`logprobs`: alternatives per token (None: not asked); `param`: the body field that
    asked them (chat's top_logprobs or logprobs, completions' logprobs). The 400 names the
    field the client most likely wants to lower: the alternatives, else n, else max_tokens."""
    if logprobs is None:
        return
    entries = max_tokens * n * (1 + logprobs)
    if entries <= MAX_REPLY_ENTRIES:
        return
    at_fault = param if logprobs else "n" if n > 1 else "max_tokens"
    raise ApiError(400, f"max_tokens ({max_tokens}) x n ({n}) x (1 + {param} ({logprobs})) "
                        f"= {entries} logprob entries exceeds this server's bound of "
                        f"{MAX_REPLY_ENTRIES} per reply; lower max_tokens, n or {param}",
                   at_fault)
