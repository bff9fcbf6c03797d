"""The gateway's replies in OpenAI's shapes: text_completion, chat.completion and their
streaming chunks, for n choices, with logprobs when asked and the engine's request
metrics under the top-level key `tl`.

A batch of prompts (/v1/completions) has n choices per prompt: choice i is prompt i // n's
sample i % n. `usage` (prompt tokens once per prompt, completion tokens summed over the
choices) is on every whole reply; in a stream when stream_options asks: include_usage as
one last chunk with no choices, continuous_usage_stats on every chunk (the tokens so far).
`tl` is choice 0's Delta.metrics, on the whole reply and on a stream's last chunk; with
several choices every choice carries its own too (in a stream, on its finishing chunk).
finish_reason keeps OpenAI's values: the engine's "stop" and "length" pass through; an
engine "abort" never becomes one: the gateway answers it as a 503 instead (generate.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from frontend.http import logprobs, prompt_logprob_fields
from frontend.http.schema import GenRequest
from frontend.http.tokens import Tokens


@dataclass
class Tally:
    """One choice's progress: its text, tokens, logprobs and the times the metrics need."""
    started: float
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    answered: bool = False         # a first delta came
    entries: list = field(default_factory=list)
    metrics: dict | None = None
    prompt: tuple = ((), None)     # the prompt's ids and the engine's prompt logprobs

    def add(self, d, now: float) -> None:
        self.answered = True
        if d.prompt_logprobs is not None:
            self.prompt = (d.prompt_token_ids, d.prompt_logprobs)
        self.text += d.text
        self.entries += logprobs.entries(d)
        if d.prompt_token_ids is not None:
            self.prompt_tokens = len(d.prompt_token_ids)
        if d.token_ids:
            self.completion_tokens += len(d.token_ids)
            self.first_token_at = self.first_token_at or now
            self.last_token_at = now
        if d.finish_reason is not None:
            self.finish_reason, self.metrics = d.finish_reason, d.metrics


def usage(tallies: list[Tally], n: int = 1, completion: int | None = None) -> dict:
    """`n`: choices per prompt; each prompt's first choice counts its prompt.
    `completion`: the tokens sent so far (default: every choice's tokens)."""
    firsts = tallies[::n]
    prompt = sum(t.prompt_tokens for t in firsts)
    if completion is None:
        completion = sum(t.completion_tokens for t in tallies)
    cached = sum((t.metrics or {}).get("cached_tokens") or 0 for t in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class CompletionFormat:
    """Stateful per request: a stream's chunks must be made in the order they are sent."""
    object, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"
    prompt_logprobs_at_top = False   # vLLM: on each completions choice, once in a chat reply
    done = b"data: [DONE]\n\n"      # a stream's last write

    def __init__(self, model: str, gen: GenRequest, tokens: Tokens | None = None):
        self.model, self.created = model, int(time.time())
        self.id = self.id_prefix + gen.msg.request_id
        self.n, self.per_prompt = gen.choices, gen.n
        self.usage_chunk, self.continuous = gen.include_usage, gen.continuous_usage
        self.logprobs = gen.msg.logprobs is not None
        self.ask = gen.prompt_ask
        self.tokens = tokens
        self.echo = [_echo_text(gen, p, tokens) for p in gen.batch]  # per prompt
        self._carry: list[list] = [[] for _ in range(self.n)]  # logprobs of unsent tokens
        self._offset = [0] * self.n                             # completions' text_offset
        self._unsent = [True] * self.n                          # no chunk of choice i yet
        self._sent = 0                          # tokens in the chunks made so far
        self._finished = 0

    def frame(self, event: dict) -> bytes:
        """One Server-Sent Event of the stream."""
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    def failure(self, error_body: dict) -> dict:
        """The event that tells a started stream it failed: OpenAI's error object."""
        return error_body

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, tallies: list[Tally]) -> dict:
        choices = []
        for i, t in enumerate(tallies):
            choice = self._whole(i, t)
            if self.n > 1:
                choice["tl"] = t.metrics
            choices.append(choice)
        out = {**self._head(self.object), "choices": choices, "usage": self._usage(tallies),
               "tl": tallies[0].metrics}
        if self.ask.vllm is not None and self.prompt_logprobs_at_top:
            out["prompt_logprobs"] = self._vllm(tallies[0])
        return out

    def _usage(self, tallies: list[Tally]) -> dict:
        return usage(tallies, self.per_prompt)

    def _with_usage(self, chunk: dict, tallies: list[Tally]) -> dict:
        """A stream chunk, with the usage of the tokens sent so far (this chunk's included)
        when continuous_usage_stats asks."""
        if self.continuous:
            chunk["usage"] = usage(tallies, self.per_prompt, self._sent)
        return chunk

    def opening(self, tallies: list[Tally]) -> list[dict]:
        return []

    def chunk(self, tallies: list[Tally], i: int, d) -> dict | None:
        """Choice i's chunk for delta d; None for a delta with no text yet (its logprobs
        go with the next chunk of the choice)."""
        self._carry[i] += self._echoed((d.prompt_token_ids, d.prompt_logprobs))
        self._carry[i] += logprobs.entries(d)
        self._sent += len(d.token_ids)
        if not d.text and d.finish_reason is None:
            return None
        got, self._carry[i] = self._carry[i], []
        choice = self._part(i, d.text, got, d.finish_reason)
        self._unsent[i] = False
        out = {**self._head(self.chunk_object), "choices": [choice]}
        if d.finish_reason is not None:
            self._finished += 1
            if self.n > 1:
                choice["tl"] = d.metrics
            if self._finished == self.n and not self.usage_chunk:
                out["tl"] = tallies[0].metrics
        return self._with_usage(out, tallies)

    def closing(self, tallies: list[Tally]) -> list[dict]:
        if not self.usage_chunk:
            return []
        return [{**self._head(self.chunk_object), "choices": [], "usage": self._usage(tallies),
                 "tl": tallies[0].metrics}]

    # ------------------------------------------------------------ per endpoint

    def _whole(self, i: int, t: Tally) -> dict:
        choice = {"index": i, "text": self._echo(i) + t.text,
                  "logprobs": self._lp(i, self._echoed(t.prompt) + t.entries),
                  "finish_reason": t.finish_reason}
        if self.ask.vllm is not None:
            choice["prompt_logprobs"] = self._vllm(t)
        return choice

    def _echo(self, i: int) -> str:
        return self.echo[i // self.per_prompt]

    def _echoed(self, prompt: tuple) -> list:
        """echo with logprobs: the choice's own prompt's entries, ahead of its completion's."""
        if self.ask.echo_logprobs is None or prompt[1] is None:
            return []
        return prompt_logprob_fields.echo_entries(*prompt, self.ask.echo_logprobs)

    def _vllm(self, t: Tally) -> list | None:
        if t.prompt[1] is None:
            return None
        return prompt_logprob_fields.vllm_shape(self.tokens, *t.prompt, self.ask.vllm)

    def _part(self, i: int, text: str, got: list, finish: str | None) -> dict:
        if self._unsent[i]:
            text = self._echo(i) + text
        return {"index": i, "text": text, "logprobs": self._lp(i, got),
                "finish_reason": finish}

    def _lp(self, i: int, got: list) -> dict | None:
        if not self.logprobs:
            return None
        shaped, self._offset[i] = logprobs.completion(self.tokens, got, self._offset[i])
        return shaped


class ChatFormat(CompletionFormat):
    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"
    prompt_logprobs_at_top = True

    def opening(self, tallies: list[Tally]) -> list[dict]:
        return [self._with_usage({
            **self._head(self.chunk_object),
            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}]}, tallies)
            for i in range(self.n)]

    def _whole(self, i: int, t: Tally) -> dict:
        return {"index": i, "message": {"role": "assistant", "content": t.text},
                "logprobs": self._lp(i, t.entries), "finish_reason": t.finish_reason}

    def _part(self, i: int, text: str, got: list, finish: str | None) -> dict:
        return {"index": i, "delta": {"content": text} if text else {},
                "logprobs": self._lp(i, got), "finish_reason": finish}

    def _lp(self, i: int, got: list) -> dict | None:
        return logprobs.chat(self.tokens, got) if self.logprobs else None


def _echo_text(gen: GenRequest, prompt, tokens: Tokens | None) -> str:
    if not gen.echo:
        return ""
    return prompt if isinstance(prompt, str) else tokens.decode(prompt, "prompt")
