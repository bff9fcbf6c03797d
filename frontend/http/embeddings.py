"""POST /v1/embeddings (docs/design/interfaces.md, "HTTP gateway"): OpenAI's body and reply
over the engine's embed requests, one per input, fanned out at once (fanout.py) under the
user's cap. Last-token pooling, L2-normalised (docs/design/worker.md, "Embeddings")."""
from __future__ import annotations

import base64
import time

from aiohttp import web

from core.ipc.protocol import F32
from frontend.client.common import ClientError
from frontend.http.errors import ApiError
from frontend.http.fanout import FanOut
from frontend.http.identity import key_hash

MAX_INPUTS = 2048          # OpenAI's bound on one body's inputs
FORMATS = ("float", "base64")


def parse_inputs(body: dict, hidden_size: int) -> tuple[list, str]:
    """The body's inputs (each a non-empty string or id list) and its encoding_format; an
    ApiError(400) naming the field otherwise."""
    fmt = body.get("encoding_format", "float")
    if fmt not in FORMATS:
        raise ApiError(400, f"encoding_format must be one of {list(FORMATS)}", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (type(dims) is not int or dims != hidden_size):
        raise ApiError(400, f"dimensions: this model's embeddings have {hidden_size} and cannot"
                            " be shortened", "dimensions")
    check_user(body)
    return _inputs(body.get("input")), fmt


def check_user(body: dict) -> None:
    """OpenAI's `user`: absent or a string."""
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "user must be a string", "user")


def _inputs(raw) -> list:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "input must be a non-empty string, list of strings, list of token"
                            " ids or list of lists of token ids", "input")
    if all(_is_id(t) for t in raw):
        return [raw]
    if len(raw) > MAX_INPUTS:
        raise ApiError(400, f"input holds {len(raw)} items; at most {MAX_INPUTS}", "input")
    if all(isinstance(x, str) for x in raw):
        if any(x == "" for x in raw):
            raise ApiError(400, "input must not hold an empty string", "input")
        return raw
    if all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in raw):
        return raw
    raise ApiError(400, "input must be all strings or all token id lists (a mixed batch, an"
                        " empty list or a non-integer id is refused)", "input")


def _is_id(t) -> bool:
    return type(t) is int and t >= 0


def encoded(vector: F32, fmt: str):
    """A vector as floats, or base64 of its little-endian float32 bytes (what OpenAI's
    SDK decodes)."""
    if fmt == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    return [float(x) for x in vector]


async def embeddings(request: web.Request, client, body: dict, priority: int | None,
                     model: str, hidden_size: int) -> web.Response:
    inputs, fmt = parse_inputs(body, hidden_size)
    vectors, tokens = await embed_all(request, client, inputs, priority, body.get("user"))
    return web.json_response({
        "object": "list", "model": model, "created": int(time.time()),
        "data": [{"object": "embedding", "index": i, "embedding": encoded(v, fmt)}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def embed_all(request: web.Request, client, inputs: list, priority: int | None,
                    user: str | None, params: str | list[str] = "input"
                    ) -> tuple[list[F32], int]:
    """Each input's vector, in order, and the prompt tokens they took: one engine request
    per input, all at once under the user's cap (a 429 before any is sent when they do not
    fit). An engine refusal is an ApiError naming the input's field (`params`: one for all,
    or each input's) where the engine named the prompt."""
    common = {"key_hash": key_hash(request), "user": user}
    if priority is not None:
        common["priority"] = priority
    requests = [{"prompt": p, **common} for p in inputs]
    vectors: list = [None] * len(inputs)
    tokens = 0
    async with FanOut(client, requests, method="embed_stream") as fan:
        while any(v is None for v in vectors):
            try:
                i, d = await fan.next()
            except ClientError as e:
                param = params if isinstance(params, str) else params[fan.failed]
                raise ApiError(e.code if e.code in (400, 413, 429, 503) else 503, e.message,
                               param if e.param == "prompt" else e.param) from None
            if d.finish_reason == "abort" or (d.finish_reason and d.embedding is None):
                raise ApiError(503, "the engine ended an embedding without its vector")
            if d.embedding is not None:
                vectors[i] = d.embedding
                tokens += len(d.prompt_token_ids or ())
    return vectors, tokens
