"""The engine's side of `scripts/bench quality`: prompt logprobs over its HTTP gateway for
the perplexity windows, greedy generations with logprobs through its client for the
agreement check. The group is started and stopped by the caller (scripts.group.harness)."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from scripts.benchmarks import _quality_ppl as qp


def prompt_logprobs(http: str, window: list[int], timeout: float = 600) -> list[float | None]:
    """Each prompt token's logprob given those before it (None for the first), scoring the
    prompt alone: /v1/completions with the window as token ids, echo, logprobs, and no
    generated token."""
    body = {"prompt": window, "max_tokens": 0, "echo": True, "logprobs": 0,
            "temperature": 0.0}
    req = urllib.request.Request(f"{http}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            reply = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"the gateway refused a prompt-logprob request: HTTP {e.code} "
                           f"{e.read()[:300]!r}") from None
    lps = reply["choices"][0]["logprobs"]["token_logprobs"]
    if len(lps) != len(window):
        raise RuntimeError(f"the gateway echoed {len(lps)} logprobs for {len(window)} "
                           "prompt tokens (a generated token crept in?)")
    return lps


def score(http: str, wins: list[list[int]], ctx: int) -> list[list[float]]:
    """Each window's scored logprobs, one request per window, in turn."""
    return [qp.scored_logprobs(prompt_logprobs(http, w), ctx) for w in wins]


async def _greedy(address: str, prompts: list[list[int]], n: int, stop_ids: list[int]):
    from frontend.client import AsyncClient
    async with AsyncClient(address, timeout=600) as c:
        return await asyncio.gather(*(
            c.generate(p, max_tokens=n, temperature=0.0, logprobs=2, stop_token_ids=stop_ids)
            for p in prompts))


def greedy(address: str, prompts: list[list[int]], n: int,
           stop_ids: list[int]) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Each prompt's first n greedy tokens (stopping on any of stop_ids, llama.cpp's
    end-of-generation tokens) and, per token, its top-2 alternatives {id: logprob}."""
    results = asyncio.run(_greedy(address, prompts, n, stop_ids))
    return [(list(r.token_ids), list(r.top_logprobs or [])) for r in results]
