"""Incremental detokenization: turn a request's new token ids into new text, step by step.

Each step decodes only a short window of ids, from `prefix` (a point a few tokens back,
at a character boundary) to the end, and emits what that window decodes to beyond the
text of [prefix, read). Decoding a window rather than single tokens keeps tokenizers
whose pieces depend on their neighbours (leading spaces of SentencePiece, byte fallback)
right. Text ending in U+FFFD is held back: it is usually a UTF-8 character whose bytes
have not all arrived yet, so a character is never split across deltas.

StreamDetokenizer is the same algorithm in the `tokenizers` library's own code
(DecodeStream: both decodes of a step in one call, no Python around them), for the
tokenizers whose decode is the library's alone (frontend/tokenizer.py); Detokenizer is for
the others.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tokenizers.decoders import DecodeStream

REPLACEMENT = "\ufffd"
# How many prompt tokens give the first output tokens their context.
PROMPT_CONTEXT = 5

Decode = Callable[[Sequence[int]], str]


def prompt_context(decode: Decode, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's last ids that give the first output tokens their context."""
    tail = list(prompt_ids[-PROMPT_CONTEXT:])
    # A prompt that ends inside a character gives no context: its dangling bytes
    # would otherwise swallow the first output bytes into text that is never sent.
    return [] if tail and decode(tail).endswith(REPLACEMENT) else tail


class Detokenizer:
    """One request's incremental decoder; `push` new ids each step, `flush` at the end."""

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()):
        self._decode = decode
        tail = prompt_context(decode, prompt_ids)
        self._ids: list[int] = tail
        self._prefix = 0            # start of the decoding window
        self._read = len(tail)      # ids before this have had their text emitted

    @classmethod
    def resume(cls, decode: Decode, given: Sequence[int], held: Sequence[int]) -> "Detokenizer":
        """One whose last text was that of `given` (from the ids before them) and which
        holds `held` back since: where a StreamDetokenizer stood."""
        d = cls(decode)
        d._ids, d._read = [*given, *held], len(given)
        return d

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


class StreamDetokenizer:
    """Detokenizer's behaviour through a `tokenizers.Tokenizer`'s DecodeStream: a step's
    text is all or nothing (None while it ends in U+FFFD), so the ids it holds back are
    exactly those pushed since it last gave text, and `flush` decodes them after the ids
    of the last text, as Detokenizer's window does."""

    def __init__(self, tokenizer, skip_special_tokens: bool, prompt_ids: Sequence[int] = ()):
        self._tok, self._skip = tokenizer, skip_special_tokens
        tail = prompt_context(self._decode, prompt_ids)
        self._stream = DecodeStream(ids=tail, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []
        self._last: list[int] = tail   # the ids of the last text given
        self._window: Detokenizer | None = None   # where DecodeStream gave up

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=self._skip)

    def push(self, new_ids: Sequence[int]) -> str:
        if not new_ids:
            return ""
        ids = list(new_ids)
        if self._window is not None:
            return self._window.push(ids)
        try:
            text = self._stream.step(self._tok, ids)
        except Exception:   # tokenizers' own type: a later id changed the text of ids given
            # (bytes that were no character become one); the window takes it from here
            self._window = Detokenizer.resume(self._decode, self._last, self._held)
            return self._window.push(ids)
        if text is None:
            self._held += ids
            return ""
        # the common step holds nothing back: its own list, no copy
        self._last, self._held = (self._held + ids if self._held else ids), []
        return text

    def flush(self) -> str:
        if self._window is not None:
            return self._window.flush()
        if not self._held:
            return ""
        before, ids = self._decode(self._last), self._last + self._held
        self._last, self._held = ids, []
        return self._decode(ids)[len(before):]
