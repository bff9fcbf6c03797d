"""Prompt logprobs at the gateway (docs/design/worker.md, "Prompt logprobs"): what a body asks
for and the shapes of the answer.

- `/v1/completions` with `echo: true` and `logprobs: N`: the prompt's tokens, with their
  logprobs (`null` for the first) and top N, ahead of the completion's in OpenAI's legacy
  `logprobs` object; with `max_tokens: 0` the prompt alone is scored (vLLM's rule: 0 only
  with echo; the engine still generates one token, which is dropped here).
- `prompt_logprobs: N` on both routes, vLLM's shape: a list with `null` first, then per
  prompt position {token id: {logprob, rank, decoded_token}} holding the prompt's token
  and the top N; on each completions choice, at the top of a chat reply. Like vLLM, not
  with `stream: true`.

The engine is asked once, for the larger N of the two; its alternatives come best first,
so each shape takes its own first N.
"""
from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass, replace

from frontend.http.errors import ApiError
from frontend.http.fields import BOOL, INT, get
from frontend.http.logprobs import Entry, _finite
from frontend.http.tokens import Tokens
from core.bounds import MAX_LOGPROBS


@dataclass(frozen=True)
class PromptAsk:
    echo_logprobs: int | None = None   # echo with logprobs: N alternatives per prompt token
    vllm: int | None = None            # prompt_logprobs: N
    prompt_only: bool = False          # max_tokens 0 with echo

    @property
    def engine(self) -> int | None:
        """The engine's prompt_logprobs: the larger of the two, None when neither asks."""
        asked = [n for n in (self.echo_logprobs, self.vllm) if n is not None]
        return max(asked) if asked else None


def completion_ask(body: dict, echo: bool, logprobs: int | None) -> PromptAsk:
    max_tokens = get(body, "max_tokens", INT)
    if max_tokens == 0 and not echo:
        raise ApiError(400, "max_tokens 0 is allowed only with echo: true (it scores the"
                            " prompt alone)", "max_tokens")
    if max_tokens == 0 and get(body, "min_tokens", INT, 0):
        raise ApiError(400, "min_tokens must be 0 with max_tokens 0", "min_tokens")
    return PromptAsk(logprobs if echo else None, _vllm(body), max_tokens == 0)


def chat_ask(body: dict) -> PromptAsk:
    return PromptAsk(vllm=_vllm(body))


def _vllm(body: dict) -> int | None:
    n = get(body, "prompt_logprobs", INT)
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise ApiError(400, f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {n}",
                       "prompt_logprobs")
    if n is not None and get(body, "stream", BOOL, False):
        raise ApiError(400, "prompt_logprobs is not available with stream: true",
                       "prompt_logprobs")
    return n


def engine_max_tokens(ask: PromptAsk, max_tokens: int) -> int:
    """The engine generates at least one token: max_tokens 0 asks it for one (dropped)."""
    return 1 if ask.prompt_only else max_tokens


def client_for(ask: PromptAsk, client):
    return PromptOnly(client) if ask.prompt_only else client


class PromptOnly:
    """The client of a max_tokens 0 request: its deltas without the generated token (the
    prompt's fields stay), finishing "length" as vLLM's echo without generation does."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name: str):
        # the rest is the client's: a counted client's hold and release (the per-user cap)
        return getattr(self._client, name)

    async def stream(self, **kw):
        async with aclosing(self._client.stream(**kw)) as deltas:
            async for d in deltas:
                reason = d.finish_reason
                yield replace(d, text="", token_ids=[], logprobs=None, top_logprobs=None,
                              finish_reason="length" if reason in ("stop", "length")
                              else reason)


def echo_entries(prompt_ids, prompt_logprobs, top: int) -> list[Entry]:
    """The prompt as the legacy logprobs' entries: (id, None, None) first, then each
    token's logprob and its first `top` alternatives."""
    out: list = []
    for tok, e in zip(prompt_ids or (), prompt_logprobs or ()):
        if e is None:
            out.append((int(tok), None, None))
        else:
            lp, _, alts = e
            out.append((int(tok), _finite(lp),
                        [(int(a), _finite(b)) for a, b in alts[:top]]))
    return out


def vllm_shape(tokens: Tokens, prompt_ids, prompt_logprobs, top: int) -> list:
    """vLLM's prompt_logprobs: None, then {str(id): {logprob, rank, decoded_token}} with
    the prompt's token and the first `top` alternatives (ranks 1..top)."""
    out: list = []
    for tok, e in zip(prompt_ids or (), prompt_logprobs or ()):
        if e is None:
            out.append(None)
            continue
        lp, rank, alts = e
        pos = {str(a): _logprob(tokens, a, b, k + 1) for k, (a, b) in enumerate(alts[:top])}
        pos[str(tok)] = _logprob(tokens, tok, lp, rank)
        out.append(pos)
    return out


def _logprob(tokens: Tokens, token_id: int, logprob: float, rank: int) -> dict:
    return {"logprob": _finite(logprob), "rank": int(rank),
            "decoded_token": tokens.piece(int(token_id))}
