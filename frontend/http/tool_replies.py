"""Chat replies that carry tool calls (docs/structured.md, "Tool calls"): the reply's text
read by the served model's tool-call parser (frontend/tool_parsers.py) into OpenAI's
`message.tool_calls` (`content` null when there are only calls) with `finish_reason:
"tool_calls"`, and a stream's text deltas into OpenAI's tool-call deltas. A call the reply
was cut inside of (`length`) is in neither `tool_calls` nor `content`.

A call's id is derived from the request id, the choice and the call's index, so a request
answered twice (replay, a retry with the same request_id) gets the same ids.
"""
from __future__ import annotations

import hashlib

from frontend.http.format import ChatFormat, Tally
from frontend.http.schema import GenRequest
from frontend.http.tokens import Tokens
from frontend.tool_parsers import Call, parse, stream_for


def call_id(request_id: str, choice: int, k: int) -> str:
    h = hashlib.blake2b(f"{request_id}\0{choice}\0{k}".encode(), digest_size=12)
    return "call_" + h.hexdigest()


def chat_format(model: str, gen: GenRequest, tokens: Tokens | None, chat) -> ChatFormat:
    """The reply's format: tool calls read where tools are offered and may be called."""
    if gen.tools is None or not gen.tools.parses:
        return ChatFormat(model, gen, tokens)
    return ToolChatFormat(model, gen, tokens, chat.tool_format)


class ToolChatFormat(ChatFormat):
    def __init__(self, model: str, gen: GenRequest, tokens: Tokens | None, fmt: str):
        super().__init__(model, gen, tokens)
        self.fmt, self.request_id = fmt, gen.msg.request_id
        self.most = None if gen.tools.parallel else 1   # calls kept per choice
        self._streams = [stream_for(fmt) for _ in range(self.n)]
        self._said = [0] * self.n                       # calls a stream has said

    def _call(self, i: int, k: int, c: Call) -> dict:
        return {"id": call_id(self.request_id, i, k), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}}

    def _whole(self, i: int, t: Tally) -> dict:
        choice = super()._whole(i, t)
        content, calls = parse(self.fmt, t.text)
        calls = calls[:self.most]
        choice["message"]["content"] = content if calls or content is not None else ""
        if calls:
            choice["message"].update(content=content,
                                     tool_calls=[self._call(i, k, c)
                                                 for k, c in enumerate(calls)])
            choice["finish_reason"] = _finish(t.finish_reason)
        return choice

    def _part(self, i: int, text: str, got: list, finish: str | None) -> dict:
        s = self._streams[i]
        events = s.feed(text) + (s.finish() if finish is not None else [])
        delta: dict = {}
        content = "".join(v for kind, v in events if kind == "content")
        if content:
            delta["content"] = content
        calls = []
        for kind, v in events:
            if kind == "call" and (self.most is None or self._said[i] < self.most):
                calls.append({"index": self._said[i], **self._call(i, self._said[i], v)})
                self._said[i] += 1
        if calls:
            delta["tool_calls"] = calls
        if finish is not None and self._said[i]:
            finish = _finish(finish)
        return {"index": i, "delta": delta, "logprobs": self._lp(i, got),
                "finish_reason": finish}


def _finish(engine: str | None) -> str | None:
    """A reply with calls that ended on its own ends "tool_calls"; cut short, "length" (its
    complete calls are kept, a call it was cut inside of is dropped: tool_parsers.py)."""
    return "tool_calls" if engine == "stop" else engine
