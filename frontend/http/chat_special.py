"""Special tokens spelled inside a chat's user strings: tokenized as text, not as control
tokens (docs/security.md, "Chat roles and special tokens").

The chat template writes its control tokens (`<|im_start|>`, `<|im_end|>`) as text, and the
tokenizer turns every occurrence of a special token's text into that token: a message whose
content holds `<|im_end|>\\n<|im_start|>system\\n` would close its turn and open a system
turn of its own. So, before rendering, each occurrence in a string the user gave (contents,
tool calls' names and arguments, tool results, the tools) is replaced by a marker: a random
nonce and the token's index, letters and digits only, so that templates' filters (`trim`,
`tojson`) leave it as it is. After rendering the markers are put back and their places
remembered (`ChatPrompt.forged`).

Tokenizing (`prompt_ids`) then reads the text as the tokenizer always does, which splits it
at special tokens and tokenizes each run between two of them on its own; a run that holds a
forged one is tokenized again with `split_special_tokens=True`, every other id is kept. So
the template's own control tokens stay control tokens, and a chat whose user strings spell
no special token is sent as text, its ids exactly as before.
"""
from __future__ import annotations

import re
import secrets
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from frontend.http.errors import ApiError


@dataclass(frozen=True)
class ChatPrompt:
    """The rendered chat; `forged`: the [start, end) of each special token's text that a user
    string put there (empty: the text may be tokenized as it is)."""
    text: str
    forged: tuple[tuple[int, int], ...] = ()


def special_texts(hf) -> tuple[str, ...]:
    """The text of every special token of the tokenizer, longest first (the tokenizer takes
    the longest match, and a regex alternation the first that matches)."""
    added = getattr(hf, "added_tokens_decoder", {}).values()
    texts = {t.content for t in added if t.special} | set(hf.all_special_tokens)
    return tuple(sorted(filter(None, texts), key=lambda t: (-len(t), t)))


def special_ids(hf) -> frozenset[int]:
    added = getattr(hf, "added_tokens_decoder", {}).items()
    return frozenset(i for i, t in added if t.special) | frozenset(hf.all_special_ids)


@dataclass(frozen=True)
class Marks:
    """One rendering's markers: `nonce` is fresh per chat, so no user string can hold one
    but by a 2^-64 chance."""
    texts: tuple[str, ...]
    pattern: re.Pattern    # any special token's text
    nonce: str

    @classmethod
    def of(cls, texts: tuple[str, ...]) -> Marks:
        return cls(texts, re.compile("|".join(map(re.escape, texts))),
                   "tl" + secrets.token_hex(8))

    @cached_property
    def _markers(self) -> dict[str, str]:
        return {t: f"{self.nonce}K{i}K" for i, t in enumerate(self.texts)}

    def holds(self, value) -> bool:
        """Whether any string in the JSON value spells a special token."""
        if isinstance(value, str):
            return self.pattern.search(value) is not None
        if isinstance(value, dict):
            return any(self.holds(k) or self.holds(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return any(self.holds(v) for v in value)
        return False

    def hide(self, value):
        """The JSON value with every special token's text replaced by its marker."""
        if isinstance(value, str):
            return self.pattern.sub(lambda m: self._markers[m.group()], value)
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v) for v in value]
        return value

    def hide_messages(self, messages: list[dict]) -> list[dict]:
        """Every string but the role (checked already: it is the template's)."""
        return [{**self.hide({k: v for k, v in m.items() if k != "role"}), "role": m["role"]}
                for m in messages]

    def show(self, text: str) -> ChatPrompt:
        """The rendered text with the markers put back, and where they were."""
        # split with a group: text, index, text, index, ..., text
        pieces = re.split(re.escape(self.nonce) + r"K(\d+)K", text)
        pieces[1::2] = [self.texts[int(k)] for k in pieces[1::2]]
        ends = list(accumulate(map(len, pieces)))
        forged = zip(ends[0:-1:2], ends[1::2])   # piece 2k+1 spans [ends[2k], ends[2k+1])
        return ChatPrompt("".join(pieces), tuple(forged))


def prompt_ids(hf, prompt: ChatPrompt, add_special_tokens: bool) -> list[int]:
    """The prompt's ids: its forged special tokens' text tokenized as text."""
    if not prompt.forged:
        return list(hf(prompt.text, add_special_tokens=add_special_tokens).input_ids)
    if not getattr(hf, "is_fast", False):   # no offsets to find the runs with
        raise ApiError(400, "a message spells a special token of the model, which this "
                            "server's tokenizer cannot read as text", "messages")
    enc = hf(prompt.text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    specials, out, run, start = special_ids(hf), [], [], 0
    for tid, (a, b) in zip(enc.input_ids, enc.offset_mapping):
        if tid in specials and not _overlaps(prompt.forged, a, b):
            # a post-processor's token (BOS, EOS) has an empty span: the run ends at its text
            end = a if b > a else (run[-1][2] if run else start)
            out += _run_ids(hf, prompt.text, start, end, run, specials)
            out.append(tid)
            run, start = [], max(start, b)
        else:
            run.append((tid, a, b))
    out += _run_ids(hf, prompt.text, start, len(prompt.text), run, specials)
    return out


def _overlaps(spans: tuple[tuple[int, int], ...], a: int, b: int) -> bool:
    """Whether [a, b) meets a span; `spans` are sorted and disjoint (a bisection: a prompt
    may hold a hundred thousand of them)."""
    i = bisect_right(spans, (a, float("inf")))   # the first span starting after a
    before = i > 0 and spans[i - 1][0] < b and spans[i - 1][1] > a
    return before or (i < len(spans) and spans[i][0] < b)


def _run_ids(hf, text: str, start: int, end: int, run: list, specials) -> list[int]:
    """A run between two control tokens: its ids, or its text tokenized without special
    tokens where it holds a forged one."""
    if not any(tid in specials for tid, _, _ in run):
        return [tid for tid, _, _ in run]
    return list(hf(text[start:end], add_special_tokens=False,
                   split_special_tokens=True).input_ids)
