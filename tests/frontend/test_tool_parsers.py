"""frontend/tool_parsers.py: the Hermes and Llama 3 JSON tool-call parsers, whole and
streamed (pure; no engine). A stream's deltas, cut anywhere, add up to the whole parse."""
from __future__ import annotations

import json

import pytest

from frontend.tool_parsers import CLOSE, HERMES, LLAMA3, Call, call_of, parse, stream_for

GET = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
W = Call("get_weather", '{"city":"Paris","days":2}')
T = Call("time", "{}")

HERMES_CASES = [
    # (text, content, calls)
    ("Hello there.", "Hello there.", []),
    ("", None, []),
    (f"<tool_call>\n{GET}\n</tool_call>", None, [W]),
    (f"<tool_call>{GET}</tool_call>", None, [W]),
    (f"\n<tool_call>\n{GET}\n</tool_call>\n", None, [W]),
    (f"Let me look.\n<tool_call>\n{GET}\n</tool_call>", "Let me look.", [W]),
    (f'<tool_call>\n{GET}\n</tool_call>\n<tool_call>\n{{"name": "time"}}\n</tool_call>',
     None, [W, T]),
    (f"A <tool_call>{GET}</tool_call> then B", "A  then B", [W]),
    # an unclosed last call (the model stopped at its end) is still read
    (f"<tool_call>\n{GET}\n", None, [W]),
    # arguments as a JSON string, and "parameters" for "arguments"
    ('<tool_call>{"name": "time", "arguments": "{}"}</tool_call>', None, [T]),
    ('<tool_call>{"name": "time", "parameters": {}}</tool_call>', None, [T]),
    # malformed: stays content, as written
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
    # a call the reply ends inside of (cut at max_tokens) is dropped, never content
    ("<tool_call>{\"name\": \"f\", ", None, []),
    ('Checking.\n<tool_call>\n{"name": "f", "arguments": {"a": "x', "Checking.\n", []),
    (f'<tool_call>\n{GET}\n</tool_call>\n<tool_call>\n{{"name": "ti', None, [W]),
    ("a <tool_ca", "a ", []),   # a tag cut off is a call cut off
    ("a <", "a <", []),         # one character is no tag yet
    ("x < y and <tool> tags", "x < y and <tool> tags", []),
    # one good call among bad text: the bad block is content
    (f"<tool_call>oops</tool_call>\n<tool_call>{GET}</tool_call>",
     "<tool_call>oops</tool_call>", [W]),
    ("  spaced  ", "  spaced  ", []),
]

LLAMA_CASES = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', None, [W]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
     None, [W]),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
     '{"name": "time", "parameters": {}}', None, [W, T]),
    ('  {"name": "time", "arguments": {}}\n', None, [T]),
    ("The weather is fine.", "The weather is fine.", []),
    ('{"answer": 42}', '{"answer": 42}', []),
    # a call cut off is dropped; unfinished JSON that is no call's start stays content
    ('{"name": "time", "parameters": {', None, []),
    ('{"name": "time", "parameters": {}}; {"name": "get_w', None, [T]),
    ('<|python_tag|>{"na', None, []),
    ('{"answer": [1, 2', '{"answer": [1, 2', []),
    ('{"name": "time", "parameters": {}} and more', " and more", [T]),
    ("", None, []),
    ("<|python_tag|>", None, []),
]


@pytest.mark.parametrize("text,content,calls", HERMES_CASES)
def test_hermes(text, content, calls):
    assert parse(HERMES, text) == (content, calls)


@pytest.mark.parametrize("text,content,calls", LLAMA_CASES)
def test_llama3(text, content, calls):
    assert parse(LLAMA3, text) == (content, calls)


def _streamed(fmt: str, pieces: list[str]) -> tuple[str | None, list[Call]]:
    s = stream_for(fmt)
    events = [e for p in pieces for e in s.feed(p)] + s.finish()
    content = "".join(v for kind, v in events if kind == "content")
    return content or None, [v for kind, v in events if kind == "call"]


CASES = [(HERMES, *c) for c in HERMES_CASES] + [(LLAMA3, *c) for c in LLAMA_CASES]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_a_stream_cut_anywhere_adds_up_to_the_whole_parse(fmt, text, content, calls):
    whole = parse(fmt, text)
    assert _streamed(fmt, list(text)) == whole               # a character at a time
    for cut in range(len(text) + 1):                          # two pieces, every cut
        assert _streamed(fmt, [text[:cut], text[cut:]]) == whole, cut
    for size in (3, 7):
        assert _streamed(fmt, [text[k:k + size] for k in range(0, len(text), size)]) == whole


def test_a_stream_holds_back_only_what_may_start_a_call():
    s = stream_for(HERMES)
    assert s.feed("Let me check") == [("content", "Let me check")]
    assert s.feed(" <tool_") == []            # may start a call
    assert s.feed("call>\n{\"name\": \"time\"") == []
    assert s.feed("}\n</tool_call>") == [("call", T)]   # the space before it: not content
    s = stream_for(HERMES)
    assert s.feed("a <b") == [("content", "a <b")]   # "<b" cannot start a call
    s = stream_for(HERMES)
    out = s.feed(f"<tool_call>{GET}</tool_call>")
    assert out == [("call", W)]                # said as soon as it closes, before finish


def test_a_call_is_said_once_complete_and_content_keeps_streaming():
    s = stream_for(HERMES)
    said = s.feed(f"Sure.\n<tool_call>{GET}</tool_call>\nDone")
    assert said == [("content", "Sure."), ("call", W), ("content", "\n\nDone")]
    assert s.finish() == []


def test_call_of_reads_the_call_and_writes_compact_arguments():
    assert call_of(GET) == W
    assert json.loads(call_of(GET).arguments) == {"city": "Paris", "days": 2}
    assert call_of('{"name": "f", "arguments": {"q": "é"}}').arguments == '{"q":"é"}'
    for bad in ("", "[]", '{"name": ""}', '{"name": 3}', '{"name": "f", "arguments": 3}',
                '{"name": "f", "arguments": "[1]"}', '{"name": "f", "arguments": "{"}'):
        assert call_of(bad) is None, bad


@pytest.mark.parametrize("fmt,opening", [(HERMES, "<tool_call>"), (LLAMA3, "")])
@pytest.mark.parametrize("depth", [70, 1100, 100_000])
def test_hostile_nesting_is_content_not_a_crash(fmt, opening, depth):
    """Output forced to a call's opening then thousands of `[` (or arguments nested past the
    JSON depth bound) is no call, whole or streamed, and never raises: content where it
    ends, dropped where the reply stops inside it."""
    text = opening + '{"name": "f", "arguments": ' + "[" * depth
    if depth == 70:   # parses, but nests past the bound
        text += "]" * depth + "}" + (CLOSE if fmt == HERMES else "")
    content, calls = parse(fmt, text)
    assert calls == []
    assert content.startswith(opening) if depth == 70 else content is None
    s = stream_for(fmt)
    events = [e for chunk in (text[i:i + 500] for i in range(0, len(text), 500))
              for e in s.feed(chunk)] + s.finish()
    assert all(kind == "content" for kind, _ in events)
