"""The /v1/responses reply in OpenAI's shapes: the `response` object, and a stream's events
(response.created ... response.completed), made from the chat path's engine deltas
(docs/http.md, "/v1/responses").

One machine makes both: the reply's text is fed through the tool-call parser where tools
may be called (frontend/tool_parsers.py; plain text otherwise), and its content and calls
open, fill and close output items; a whole reply feeds the whole text at once and keeps
only the items. So a stream's items are the whole reply's. A reply cut at the token limit
is `status: "incomplete"` with `incomplete_details.reason: "max_output_tokens"`; a call
id is tool_replies.call_id's, stable for a request id.
"""
from __future__ import annotations

import copy
import json
import time
from typing import Callable

from frontend.http.format import Tally
from frontend.http.schema import GenRequest
from frontend.http.tool_replies import call_id
from frontend.tool_parsers import stream_for


class PlainText:
    """The parser's interface for a reply that is never read for calls."""

    def feed(self, text: str) -> list[tuple]:
        return [("content", text)] if text else []

    def finish(self) -> list[tuple]:
        return []


class ResponsesFormat:
    """Stateful per request (n is 1): events must be made in the order they are sent.
    `echo`: the request's fields the response object repeats; `on_done`: called once
    with the final response object."""
    done = b""   # a Responses stream ends with its last event, not `data: [DONE]`

    def __init__(self, model: str, gen: GenRequest, echo: dict, tool_format: str | None,
                 on_done: Callable[[dict], None] | None = None):
        self.model, self.created = model, int(time.time())
        self.request_id = gen.msg.request_id
        self.id = "resp_" + self.request_id
        self.echo, self.on_done = echo, on_done
        parses = gen.tools is not None and gen.tools.parses
        self.parser = stream_for(tool_format) if parses else PlainText()
        self.most = None if not parses or gen.tools.parallel else 1   # calls kept
        self.output: list[dict] = []
        self.message: dict | None = None    # the message item being written
        self.calls = 0
        self.seq = 0

    # ------------------------------------------------------------ generate.py's interface

    def frame(self, event: dict) -> bytes:
        event = {**event, "sequence_number": self.seq}
        self.seq += 1
        return (f"event: {event['type']}\ndata: ".encode()
                + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")

    def failure(self, error_body: dict) -> dict:
        e = error_body["error"]
        return {"type": "error", "code": str(e["code"]), "message": e["message"],
                "param": e["param"]}

    def opening(self, tallies: list[Tally]) -> list[dict]:
        shown = self._response("in_progress", tallies)
        return [{"type": "response.created", "response": shown},
                {"type": "response.in_progress", "response": shown}]

    def chunk(self, tallies: list[Tally], i: int, d) -> list[dict]:
        return self._consume(d.text, d.finish_reason)

    def closing(self, tallies: list[Tally]) -> list[dict]:
        response = self._final(tallies)
        kind = "completed" if response["status"] == "completed" else "incomplete"
        return [{"type": f"response.{kind}", "response": response}]

    def body(self, tallies: list[Tally]) -> dict:
        t = tallies[0]
        self._consume(t.text, t.finish_reason)
        return self._final(tallies)

    # ------------------------------------------------------------ items

    def _consume(self, text: str, finish: str | None) -> list[dict]:
        events = []
        said = self.parser.feed(text) + (self.parser.finish() if finish else [])
        for kind, value in said:
            if kind == "content":
                events += self._text(value)
            elif self.most is None or self.calls < self.most:
                events += self._close_message(None) + self._call(value)
        if finish is not None:
            if not self.output:   # a reply of no text is one empty message
                events += self._open_message()
            events += self._close_message(finish)
        return events

    def _open_message(self) -> list[dict]:
        index = len(self.output)
        self.message = {"id": f"msg_{self.request_id}_{index}", "type": "message",
                        "status": "in_progress", "role": "assistant", "content": []}
        self.output.append(self.message)
        self._part_text = ""
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": copy.deepcopy(self.message)},
                {**self._at(), "type": "response.content_part.added", "part": _part("")}]

    def _at(self) -> dict:
        return {"item_id": self.message["id"], "output_index": len(self.output) - 1,
                "content_index": 0}

    def _text(self, text: str) -> list[dict]:
        events = self._open_message() if self.message is None else []
        self._part_text += text
        return events + [{**self._at(), "type": "response.output_text.delta", "delta": text,
                          "logprobs": []}]

    def _close_message(self, finish: str | None) -> list[dict]:
        if self.message is None:
            return []
        at, text = self._at(), self._part_text
        self.message.update(content=[_part(text)],
                            status="incomplete" if finish == "length" else "completed")
        self.message = None
        return [{**at, "type": "response.output_text.done", "text": text, "logprobs": []},
                {**at, "type": "response.content_part.done", "part": _part(text)},
                {"type": "response.output_item.done", "output_index": at["output_index"],
                 "item": copy.deepcopy(self.output[-1])}]

    def _call(self, c) -> list[dict]:
        index, k = len(self.output), self.calls
        self.calls += 1
        item = {"id": f"fc_{self.request_id}_{k}", "type": "function_call",
                "status": "completed", "call_id": call_id(self.request_id, 0, k),
                "name": c.name, "arguments": c.arguments}
        self.output.append(item)
        at = {"item_id": item["id"], "output_index": index}
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "arguments": ""}},
                {**at, "type": "response.function_call_arguments.delta",
                 "delta": c.arguments},
                {**at, "type": "response.function_call_arguments.done", "name": c.name,
                 "arguments": c.arguments},
                {"type": "response.output_item.done", "output_index": index,
                 "item": dict(item)}]

    # ------------------------------------------------------------ the response object

    def _final(self, tallies: list[Tally]) -> dict:
        cut = tallies[0].finish_reason == "length"
        response = self._response("incomplete" if cut else "completed", tallies)
        if self.on_done is not None:
            self.on_done(response)
        return response

    def _response(self, status: str, tallies: list[Tally]) -> dict:
        done = status != "in_progress"
        t = tallies[0]
        cached = (t.metrics or {}).get("cached_tokens") or 0
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "error": None,
            "incomplete_details": ({"reason": "max_output_tokens"}
                                   if status == "incomplete" else None),
            "model": self.model, "output": copy.deepcopy(self.output) if done else [],
            **self.echo,
            "usage": {"input_tokens": t.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": t.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": t.prompt_tokens + t.completion_tokens} if done else None,
            "tl": t.metrics if done else None}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def echoed(body: dict, tools: list | None) -> dict:
    """The request's fields a response object repeats, at their defaults where not given."""
    text = body.get("text") or {}
    return {"instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": text.get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": tools or [],
            "top_p": body.get("top_p", 1.0), "truncation": "disabled",
            "user": body.get("user"), "metadata": body.get("metadata") or {}}
