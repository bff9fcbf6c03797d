"""The gateway's replies in OpenAI's shapes: text_completion, chat.completion and their
streaming chunks, with `usage` on the whole reply and on the final chunk.

finish_reason keeps OpenAI's values: the engine's "stop" and "length" pass through; an
engine "abort" (drain timeout, operator abort) never becomes a finish_reason: the gateway
answers it as a 503 error instead (see frontend/http/generate.py).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class Tally:
    """One request's progress: text so far, token counts and the times the metrics need."""
    started: float
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    id_hex: str = field(default_factory=lambda: uuid.uuid4().hex)

    def add(self, d, now: float) -> None:
        self.text += d.text
        if d.prompt_token_ids is not None:
            self.prompt_tokens = len(d.prompt_token_ids)
        if d.token_ids:
            self.completion_tokens += len(d.token_ids)
            self.first_token_at = self.first_token_at or now
            self.last_token_at = now
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class CompletionFormat:
    object, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"

    def __init__(self, model: str):
        self.model, self.created = model, int(time.time())

    def _head(self, t: Tally, obj: str) -> dict:
        return {"id": self.id_prefix + t.id_hex, "object": obj, "created": self.created,
                "model": self.model}

    def body(self, t: Tally) -> dict:
        choice = {"index": 0, "text": t.text, "logprobs": None,
                  "finish_reason": t.finish_reason}
        return {**self._head(t, self.object), "choices": [choice], "usage": t.usage()}

    def opening(self, t: Tally) -> list[dict]:
        return []

    def chunk(self, t: Tally, text: str, finish: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._with_usage({**self._head(t, self.chunk_object), "choices": [choice]},
                                t, finish)

    @staticmethod
    def _with_usage(chunk: dict, t: Tally, finish: str | None) -> dict:
        if finish is not None:
            chunk["usage"] = t.usage()
        return chunk


class ChatFormat(CompletionFormat):
    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def body(self, t: Tally) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": t.text},
                  "logprobs": None, "finish_reason": t.finish_reason}
        return {**self._head(t, self.object), "choices": [choice], "usage": t.usage()}

    def opening(self, t: Tally) -> list[dict]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}
        return [{**self._head(t, self.chunk_object), "choices": [choice]}]

    def chunk(self, t: Tally, text: str, finish: str | None) -> dict:
        delta = {"content": text} if text else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._with_usage({**self._head(t, self.chunk_object), "choices": [choice]},
                                t, finish)
