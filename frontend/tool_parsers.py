"""A model's tool calls read out of its text (docs/structured.md, "Tool calls"): the Hermes
format (`<tool_call>{"name", "arguments"}</tool_call>`, any number) and Llama 3's JSON
(`{"name", "parameters"}`, after an optional `<|python_tag|>`, several joined by `;`).

One machine serves both ways of reading: `CallStream.feed` takes text deltas and returns
what can be said already (content, complete calls), holding back text that may be the start
of a call; `finish` says the rest. `parse` is feed-all-then-finish, so a stream's deltas
always add up to the whole reply's parse. A finished block that does not parse as a call
stays content; a call the reply ends inside of (cut at max_tokens) is dropped, never left
half in content: a stream holds a call's text back until it is complete, so nothing of it
was said. When a reply has calls, its trailing whitespace is not content, and
whitespace-only content is none (null): a stream holds whitespace back until more content
follows.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from frontend.plain_json import plain_problem

HERMES, LLAMA3 = "hermes", "llama3"
FORMATS = (HERMES, LLAMA3)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'\{\s*"name"\s*:')   # how a Llama 3 call's JSON begins


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str   # a JSON object, compact


def call_of(text: str, key: str = "arguments") -> Call | None:
    """The call a JSON text holds ({"name": str, key: object}; "arguments" and "parameters"
    are both read), None when it is not one."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):   # model output: any nesting may come
        return None
    return _call(obj, key)


def _call(obj, key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(key, obj.get("parameters" if key == "arguments" else "arguments", {}))
    if isinstance(args, str):   # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    # arguments past the JSON depth bound are no call: they are dumped (recursively) here
    # and by every client that reads them
    if not isinstance(args, dict) or plain_problem(args) is not None:
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":")))


class CallStream:
    """Stateful per choice. Events are ("content", str) and ("call", Call)."""

    def __init__(self):
        self._buf = ""          # fed text not yet said
        self._space = ""        # whitespace content held until more content follows
        self.calls = 0          # calls said so far

    def feed(self, text: str) -> list[tuple]:
        self._buf += text
        return self._scan(final=False)

    def finish(self) -> list[tuple]:
        out = self._scan(final=True)
        if self._space and not self.calls:
            out.append(("content", self._space))
        self._space = ""
        return out

    def _scan(self, final: bool) -> list[tuple]:
        raise NotImplementedError

    def _content(self, text: str, out: list) -> None:
        if not text:
            return
        if text.strip():
            out.append(("content", self._space + text.rstrip()))
            self._space = text[len(text.rstrip()):]
        else:
            self._space += text

    def _call(self, call: Call, out: list) -> None:
        self.calls += 1
        out.append(("call", call))


class HermesStream(CallStream):
    def _scan(self, final: bool) -> list[tuple]:
        out: list[tuple] = []
        while self._buf:
            start = self._buf.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self._buf, OPEN)
                if final:   # a tag cut off (two characters or more) goes with its call
                    keep = keep if keep >= 2 else 0
                    self._buf = self._buf[:len(self._buf) - keep]
                    keep = 0
                self._content(self._buf[:len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep:]
                break
            self._content(self._buf[:start], out)
            self._buf = self._buf[start:]
            end = self._buf.find(CLOSE)
            if end < 0:
                if final:   # an unclosed last call: read if whole, else dropped
                    self._block(self._buf[len(OPEN):], None, out)
                    self._buf = ""
                break
            self._block(self._buf[len(OPEN):end], self._buf[:end + len(CLOSE)], out)
            self._buf = self._buf[end + len(CLOSE):]
        return out

    def _block(self, inner: str, raw: str | None, out: list) -> None:
        """`raw`: the closed block's text, content if it is no call (None: unclosed)."""
        call = call_of(inner.strip())
        if call is not None:
            self._call(call, out)
        elif raw is not None:
            self._content(raw, out)


class Llama3Stream(CallStream):
    """Calls only where the reply starts (after whitespace) with `{` or the python tag:
    JSON objects, each a call, separated by `;` and whitespace. Anything else from there on
    is content. Nothing is said until the first character decides which it is."""

    def __init__(self):
        super().__init__()
        self._mode: str | None = None   # "calls" or "text", once known
        self._decoder = json.JSONDecoder()

    def _scan(self, final: bool) -> list[tuple]:
        out: list[tuple] = []
        if self._mode is None:
            self._decide(final)
        if self._mode == "text" or (self._mode is None and final):
            self._content(self._buf, out)
            self._buf = ""
        elif self._mode == "calls":
            self._calls(final, out)
        return out

    def _decide(self, final: bool) -> None:
        head = self._buf.lstrip()
        if head.startswith(PYTHON_TAG) or head.startswith("{"):
            self._mode = "calls"
        elif head and not (PYTHON_TAG.startswith(head) and not final):
            self._mode = "text"

    def _calls(self, final: bool, out: list) -> None:
        while True:
            rest = self._buf.lstrip()
            tagged = rest.startswith(PYTHON_TAG)
            rest = rest[len(PYTHON_TAG):].lstrip() if tagged else rest
            rest = rest.lstrip("; \t\r\n") if self.calls else rest
            if not rest:
                if final:
                    self._buf = ""
                return
            if not rest.startswith("{"):
                self._mode = "text"
                self._content(self._buf, out)
                self._buf = ""
                return
            try:
                obj, n = self._decoder.raw_decode(rest)
            except (ValueError, RecursionError):
                if final:   # an unfinished object: dropped if a call, else content
                    if not (tagged or self.calls or _CALL_START.match(rest)):
                        self._content(self._buf, out)
                    self._buf = ""
                return
            call = _call(obj, "parameters")
            if call is None:
                self._mode = "text"
                self._content(self._buf, out)
                self._buf = ""
                return
            self._call(call, out)
            self._buf = rest[n:]


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def stream_for(fmt: str) -> CallStream:
    return Llama3Stream() if fmt == LLAMA3 else HermesStream()


def parse(fmt: str, text: str) -> tuple[str | None, list[Call]]:
    """(content, calls) of a whole reply; content None when it is empty (with calls:
    whitespace only). Without calls the content is the text as it is."""
    s = stream_for(fmt)
    events = s.feed(text) + s.finish()
    content = "".join(v for kind, v in events if kind == "content")
    calls = [v for kind, v in events if kind == "call"]
    return content or None, calls
