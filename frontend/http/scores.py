"""POST /v1/score and POST /v1/rerank (vLLM's bodies): cosine similarity of embeddings."""
from __future__ import annotations

import secrets
import time

from aiohttp import web

from core.ipc.protocol import F32
from frontend.http.embeddings import MAX_INPUTS, check_user, embed_all
from frontend.http.errors import ApiError

# A decoder model has no cross-encoder head: a pair's score is the cosine similarity of the
# two texts' embeddings (last-token pooling, L2-normalised, so their dot product), as vLLM
# scores with an embedding model (docs/design/interfaces.md, "HTTP gateway").


def texts(body: dict, field: str, one: bool = False) -> list[str]:
    """The field as a non-empty list of non-empty strings (a string is a list of one;
    `one`: only a string); an ApiError(400) naming the field otherwise."""
    raw = body.get(field)
    if isinstance(raw, str):
        raw = [raw]
    elif one:
        raise ApiError(400, f"{field} must be a non-empty string", field)
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, f"{field} must be a non-empty string or list of strings", field)
    if len(raw) > MAX_INPUTS:
        raise ApiError(400, f"{field} holds {len(raw)} items; at most {MAX_INPUTS}", field)
    if not all(isinstance(x, str) and x for x in raw):
        raise ApiError(400, f"{field} must hold only non-empty strings", field)
    return raw


def pairs(body: dict) -> list[tuple[str, str]]:
    """text_1 and text_2 paired: 1:1, 1:N (text_1 one string) or N:N."""
    left, right = texts(body, "text_1"), texts(body, "text_2")
    if len(left) == 1:
        return [(left[0], r) for r in right]
    if len(left) != len(right):
        raise ApiError(400, f"text_2 holds {len(right)} items and text_1 {len(left)}: they must"
                            " be 1:1, 1:N or N:N", "text_2")
    return list(zip(left, right))


def top_n(body: dict, documents: int) -> int:
    n = body.get("top_n", documents)
    if type(n) is not int or n < 1:
        raise ApiError(400, "top_n must be an integer of at least 1", "top_n")
    return min(n, documents)


def similarity(a: F32, b: F32) -> float:
    """Cosine similarity of two unit vectors."""
    return sum(x * y for x, y in zip(a, b))


async def similarities(request: web.Request, client, body: dict, priority: int | None,
                       wanted: list[tuple[str, str]], fields: tuple[str, str]
                       ) -> tuple[list[float], int]:
    """Each pair's score and the prompt tokens taken: every distinct text embedded once, in
    one fan-out (the user's cap holds them all or refuses before any is sent), the left
    texts first, so that an engine refusal (a text reaching the context) names the field
    that holds the text."""
    field_of: dict[str, str] = {}
    for side, field in enumerate(fields):
        for pair in wanted:
            field_of.setdefault(pair[side], field)
    todo = list(field_of)
    got, tokens = await embed_all(request, client, todo, priority, body.get("user"),
                                  [field_of[t] for t in todo])
    vectors = dict(zip(todo, got))
    return [similarity(vectors[a], vectors[b]) for a, b in wanted], tokens


async def score(request: web.Request, client, body: dict, priority: int | None,
                model: str) -> web.Response:
    wanted = pairs(body)
    check_user(body)
    scores, tokens = await similarities(request, client, body, priority, wanted,
                                        ("text_1", "text_2"))
    return web.json_response({
        "id": "score-" + secrets.token_hex(12), "object": "list", "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def rerank(request: web.Request, client, body: dict, priority: int | None,
                 model: str) -> web.Response:
    query = texts(body, "query", one=True)[0]
    documents = texts(body, "documents")
    if isinstance(body["documents"], str):
        raise ApiError(400, "documents must be a list of strings", "documents")
    n = top_n(body, len(documents))
    check_user(body)
    scores, tokens = await similarities(request, client, body, priority,
                                        [(query, d) for d in documents],
                                        ("query", "documents"))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:n]
    return web.json_response({
        "id": "rerank-" + secrets.token_hex(12), "model": model,
        "usage": {"total_tokens": tokens},
        "results": [{"index": i, "document": {"text": documents[i]},
                     "relevance_score": scores[i]} for i in order]})
