"""The bound on one reply's logprobs: max_tokens x choices x (1 + top alternatives)
entries (choices: prompts x n), plus each choice's prompt logprobs (echo with logprobs,
prompt_logprobs): its prompt's tokens x (1 + N).

A whole (non-streamed) reply is built in the gateway's memory, and each choice's Tally
keeps every token's logprobs until the end, streamed or not: one chat with n=16,
top_logprobs=20 and no max_tokens (2,048 tokens of context) is ~690,000 entries, a 68 MB
JSON reply and several times that in Python objects while it is built. A body whose
worst case passes MAX_REPLY_ENTRIES is refused before any engine request starts. Without
logprobs a reply is text only (n x max_tokens tokens of it), so no bound applies.

The gateway does not tokenize: a prompt of token ids counts its length, a text prompt
the most the frontend admits (max_model_len - 1 tokens).
"""
from __future__ import annotations

from frontend.http.errors import ApiError

MAX_REPLY_ENTRIES = 1 << 17   # ~100 bytes of JSON each: a reply of at most ~13 MB


def check_reply(gen, param: str, max_model_len: int | None = None):
    """`gen` (a schema.GenRequest) if its worst case fits, else a 400. `param`: the body
    field that asked the logprobs (chat's top_logprobs or logprobs, completions' logprobs).
    The 400 names what the client most likely wants to lower: the alternatives, else n,
    else the prompts of a batch, else max_tokens (the prompts' share: its alternatives,
    else n, else prompt)."""
    top, max_tokens, choices = gen.msg.logprobs, gen.msg.max_tokens, gen.choices
    completion = 0 if top is None else max_tokens * choices * (1 + top)
    prompt, prompt_param = _prompt_entries(gen, param, max_model_len)
    if completion + prompt <= MAX_REPLY_ENTRIES:
        return gen
    if prompt > completion:
        raise ApiError(400, f"the prompts' logprobs (prompt tokens x n x (1 + N), a text "
                            f"prompt counted at max_model_len - 1 tokens) are {prompt} "
                            f"entries, {completion} more for the completions: over this "
                            f"server's bound of {MAX_REPLY_ENTRIES} per reply; lower "
                            f"{prompt_param}, n, or send fewer or shorter prompts (token ids "
                            f"count exactly)", prompt_param)
    at_fault = (param if top else "n" if gen.n > 1 else "prompt" if choices > 1
                else gen.max_tokens_field)
    raise ApiError(400, f"{gen.max_tokens_field} ({max_tokens}) x choices ({choices}: prompts "
                        f"x n) x (1 + {param} ({top})) = {completion} logprob entries "
                        f"(+ {prompt} for the prompts) exceeds this server's bound of "
                        f"{MAX_REPLY_ENTRIES} per reply; lower {gen.max_tokens_field}, n or "
                        f"{param}", at_fault)


def _prompt_entries(gen, param: str, max_model_len: int | None) -> tuple[int, str]:
    """Every choice's prompt-logprob entries, and the field to lower first."""
    ask = gen.prompt_ask
    asked = [(n, p) for n, p in ((ask.echo_logprobs, param), (ask.vllm, "prompt_logprobs"))
             if n is not None]
    if not asked:
        return 0, "prompt"
    per_token = sum(1 + n for n, _ in asked)
    # an unknown context: a text prompt alone takes the whole bound
    text = max_model_len - 1 if max_model_len else MAX_REPLY_ENTRIES
    tokens = sum(len(p) if isinstance(p, list) else text for p in gen.batch)
    top, field = max(asked)
    return tokens * gen.n * per_token, field if top else "n" if gen.n > 1 else "prompt"
