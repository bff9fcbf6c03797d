"""A chat body rendered into its GenRequest off the event loop: the step /v1/chat/completions
and /v1/responses share (schema.py's parse_chat, the template bounded by render_bound.py)."""
from __future__ import annotations

from dataclasses import replace

from frontend.http.schema import GenRequest, parse_chat


async def render_chat(gw, who: str, body: dict, priority: int | None) -> GenRequest:
    """`gw`: the app's Gateway; `who`: the caller's identity (the offload queues' key).
    No max_tokens: run to the context limit (the engine ends such a request "length")."""
    gen = await gw.renders.run(who, parse_chat, body, priority, gw.chat,
                               gw.max_model_len, gw.max_model_len, gw.compiles)
    if gen.forged is not None:   # tokenized here: the frontend would read them as control tokens
        ids = await gw.offload.run(who, gw.chat.ids, gen.forged, gen.msg.add_special_tokens)
        gen.msg = replace(gen.msg, prompt=ids)
    return gen
