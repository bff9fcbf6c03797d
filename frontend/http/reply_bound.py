"""The bound on one reply's logprobs: max_tokens x choices x (1 + top alternatives)
entries (choices: prompts x n).

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


def check_reply(gen, param: str):
    """`gen` (a schema.GenRequest) if its worst case fits, else a 400. `param`: the body
    field that asked the logprobs (chat's top_logprobs or logprobs, completions' logprobs).
    The 400 names what the client most likely wants to lower: the alternatives, else n,
    else the prompts of a batch, else max_tokens."""
    top, max_tokens, choices = gen.msg.logprobs, gen.msg.max_tokens, gen.choices
    if top is None:
        return gen
    entries = max_tokens * choices * (1 + top)
    if entries <= MAX_REPLY_ENTRIES:
        return gen
    at_fault = (param if top else "n" if gen.n > 1 else "prompt" if choices > 1
                else gen.max_tokens_field)
    raise ApiError(400, f"{gen.max_tokens_field} ({max_tokens}) x choices ({choices}: prompts "
                        f"x n) x (1 + {param} ({top})) = {entries} logprob entries exceeds "
                        f"this server's bound of {MAX_REPLY_ENTRIES} per reply; lower "
                        f"{gen.max_tokens_field}, n or {param}", at_fault)
