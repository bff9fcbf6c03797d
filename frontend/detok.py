"""Incremental detokenization: turn a request's new token ids into new text, step by step.

Each step decodes only a short window of ids, from `prefix` (a point a few tokens back,
at a character boundary) to the end, and emits what that window decodes to beyond the
text of [prefix, read). Decoding a window rather than single tokens keeps tokenizers
whose pieces depend on their neighbours (leading spaces of SentencePiece, byte fallback)
right. Text ending in U+FFFD is held back: it is usually a UTF-8 character whose bytes
have not all arrived yet, so a character is never split across deltas.
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"
# How many prompt tokens give the first output tokens their context.
PROMPT_CONTEXT = 5

Decode = Callable[[Sequence[int]], str]


class Detokenizer:
    """One request's incremental decoder; `push` new ids each step, `flush` at the end."""

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()):
        self._decode = decode
        tail = list(prompt_ids[-PROMPT_CONTEXT:])
        # A prompt that ends inside a character gives no context: its dangling bytes
        # would otherwise swallow the first output bytes into text that is never sent.
        if tail and self._decode(tail).endswith(REPLACEMENT):
            tail = []
        self._ids: list[int] = tail
        self._prefix = 0            # start of the decoding window
        self._read = len(tail)      # ids before this have had their text emitted

    def push(self, new_ids: Sequence[int]) -> str:
        """The text that `new_ids` complete; may be "" while a character is incomplete."""
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        self._advance()
        return new_text[len(prefix_text):]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes to U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        self._advance()
        return new_text[len(prefix_text):]

    def _advance(self) -> None:
        # Only the window is ever decoded again, so older ids can go.
        del self._ids[:self._read]
        self._prefix, self._read = 0, len(self._ids)
