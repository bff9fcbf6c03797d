"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over the chat path
(docs/http.md, "/v1/responses").

A body is read into a chat body (response_items.py), rendered and generated as a chat
(chat_render.py, generate.py) and answered in the Responses shapes (responses_reply.py).
`store` (default true) keeps the reply in the gateway's ResponsesStore under the caller's
API key; `previous_response_id` continues a stored reply of the same key: its input and
output items go ahead of this input. An unknown id, or another key's, is a 400 naming
previous_response_id (on GET, a 404): the two read the same.
"""
from __future__ import annotations

from aiohttp import web

from frontend.http.chat_render import render_chat
from frontend.http.errors import ApiError
from frontend.http.generate import generate
from frontend.http.identity import identity, key_hash
from frontend.http.response_items import (RESPONSES_PARAM, chat_body, check_fields,
                                          checked_item, input_items, responses_param)
from frontend.http.responses_reply import ResponsesFormat, echoed

PREVIOUS = "previous_response_id"


def owner(request: web.Request) -> str:
    """Whose stored replies a request may read: its API key's short hash ("" without
    keys: one owner)."""
    return key_hash(request) or ""


async def create(request: web.Request, gw, body: dict,
                 priority: int | None) -> web.StreamResponse:
    check_fields(body)
    earlier = _earlier(gw.responses, owner(request), body.get(PREVIOUS))
    chat = chat_body(body, earlier)
    try:
        gen = await render_chat(gw, identity(request), chat, priority)
    except ApiError as e:   # said as the Responses field the chat field came from
        raise ApiError(e.status, e.message, responses_param(e.param), e.code) from None
    if gen.n != 1:
        raise ApiError(400, "a response has one output", "n")
    gen.renames = RESPONSES_PARAM
    conversation = earlier + input_items(body["input"])
    keep = None
    if body.get("store") is not False:
        def keep(response: dict) -> None:
            output = [checked_item(o, "output") for o in response["output"]]
            gw.responses.put(owner(request), response, conversation + output)
    fmt = ResponsesFormat(gw.model, gen, echoed(body, body.get("tools")),
                          gw.chat.tool_format, keep)
    return await generate(request, gw.client_for(request), gen, fmt, gw.metrics)


def _earlier(store, who: str, previous: str | None) -> list:
    if previous is None:
        return []
    stored = store.get(who, previous)
    if stored is None:
        raise ApiError(400, f"Previous response with id {previous[:80]!r} not found.",
                       PREVIOUS)
    return stored.items


def retrieve(request: web.Request, gw) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = gw.responses.get(owner(request), response_id)
    if stored is None:
        raise ApiError(404, f"No response found with id {response_id[:80]!r}.",
                       "response_id")
    return web.json_response(stored.response)
