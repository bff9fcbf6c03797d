"""Tool calls in the gateway, in-process and pure (no engine, no model): the tool fields'
400s, the grammar `required` and a named function put on the reply (checked with
llguidance over a byte-level vocabulary: it accepts exactly the valid calls, which the
format's parser reads back), the prompt through the chat template, and the replies'
`tool_calls`, whole and streamed."""
from __future__ import annotations

import json

import llguidance
import pytest
from llguidance.gbnf_to_lark import any_to_lark

from core.ipc.protocol import Delta
from frontend.http import fields
from frontend.http.chat import ChatTemplate
from frontend.http.chat_special import ChatPrompt
from frontend.http.errors import ApiError
from frontend.http.format import Tally
from frontend.http.schema import parse_chat
from frontend.http.tool_replies import ToolChatFormat, call_id, chat_format
from frontend.http.tools import tool_ask
from frontend.tool_grammar import budget_step, most_calls, string_bound
from frontend.tool_parsers import HERMES, LLAMA3, parse

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "time"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def fn(name: str, **kw) -> dict:
    return {"type": "function", "function": {"name": name, **kw}}


# ------------------------------------------------------------------ the fields' 400s

REFUSED = [
    ("tools", {"tools": "x"}),
    ("tools", {"tools": [{"type": "code"}]}),
    ("tools", {"tools": [{"function": {"name": "f"}}]}),
    ("tools", {"tools": [fn("f", parameters="x")]}),
    ("tools", {"tools": [fn("f", parameters={"type": "array"})]}),
    ("tools", {"tools": [fn("f", parameters={"type": "object",
                                             "properties": {"a": {"type": "strin"}}})]}),
    ("tools", {"tools": [fn("f", parameters={"type": "object",
                                             "properties": {"a": {"$ref": "#/nope"}}})]}),
    ("tools", {"tools": [fn("f"), fn("f")]}),
    ("tools", {"tools": [fn("")]}),
    ("tools", {"tools": [fn("has space")]}),
    ("tools", {"tools": [fn("x" * 65)]}),
    ("tools", {"tools": [fn("f", descr="typo")]}),
    ("tools", {"tools": [fn("f", strict="yes")]}),
    ("tools", {"tools": [fn(f"f{i}") for i in range(129)]}),
    ("tool_choice", {"tools": [WEATHER], "tool_choice": "sometimes"}),
    ("tool_choice", {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                         "function": {"name": "time"}}}),
    ("tool_choice", {"tools": [WEATHER], "tool_choice": {"type": "function"}}),
    ("tool_choice", {"tool_choice": "required"}),
    ("tool_choice", {"tools": [], "tool_choice": "auto"}),
    ("parallel_tool_calls", {"tools": [WEATHER], "parallel_tool_calls": "yes"}),
]


@pytest.mark.parametrize("param,body", REFUSED, ids=[f"{p}-{i}" for i, (p, _) in
                                                      enumerate(REFUSED)])
def test_refused_with_a_400_naming_the_field(param, body):
    with pytest.raises(ApiError) as e:
        tool_ask(body)
    assert (e.value.status, e.value.param) == (400, param), e.value.message


def test_the_choices():
    assert tool_ask({}) is None
    assert tool_ask({"tools": [], "tool_choice": "none"}) is None
    ask = tool_ask({"tools": [WEATHER, TIME]})
    assert (ask.choice, ask.parallel, ask.parses, ask.constrains) == ("auto", True, True, False)
    assert ask.structured_outputs(HERMES) is None
    ask = tool_ask({"tools": [WEATHER], "tool_choice": "none"})
    assert not ask.parses and ask.structured_outputs(HERMES) is None
    ask = tool_ask({"tools": [WEATHER, TIME], "parallel_tool_calls": False,
                    "tool_choice": {"type": "function", "function": {"name": "time"}}})
    assert (ask.choice, ask.name, ask.parallel) == ("named", "time", False)
    assert [f["name"] for f in ask.functions] == ["time"]


# ------------------------------------------------------------------ the grammar


class _Bytes:
    """A byte-level vocabulary for llguidance: token i is byte i, 256 is EOS."""
    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s)


@pytest.fixture(scope="module")
def accepts():
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))

    def accepts(grammar: str, text: str) -> bool:
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(
            any_to_lark(grammar)), log_level=0)
        data = list(text.encode())
        return (m.try_consume_tokens(data) == len(data) and m.is_accepting()
                and not m.is_error())
    return accepts


def hermes(*calls: dict) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(c, separators=(',', ':'))}\n</tool_call>"
                     for c in calls)


def llama(*calls: dict) -> str:
    return "; ".join(json.dumps(c, separators=(",", ":")) for c in calls)


PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
ROME = {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}
NOW = {"name": "time", "arguments": {}}


def grammar(body: dict, fmt: str = HERMES) -> str:
    return tool_ask({"tools": [WEATHER, TIME], **body}).structured_outputs(fmt)["grammar"]


def test_required_accepts_valid_calls_and_reads_them_back(accepts):
    g = grammar({"tool_choice": "required"})
    for calls in [(PARIS,), (ROME,), (NOW,), (PARIS, NOW, ROME)]:
        text = hermes(*calls)
        assert accepts(g, text), text
        content, got = parse(HERMES, text)
        assert content is None
        assert [(c.name, json.loads(c.arguments)) for c in got] == [
            (c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("text", [
    "",                                                               # no call
    "Sure!",                                                          # text
    json.dumps(PARIS),                                                # not in the format
    hermes({"name": "nope", "arguments": {}}),                        # an unoffered name
    hermes({"name": "get_weather", "arguments": {}}),                 # required arg missing
    hermes({"name": "get_weather", "arguments": {"city": 3}}),        # wrong type
    hermes({"name": "get_weather", "arguments": {"city": "P", "days": 0}}),  # minimum
    hermes({"name": "get_weather", "arguments": {"city": "P", "x": 1}}),     # extra key
    hermes({"name": "time", "arguments": {"x": 1}}),                  # no parameters
    hermes({"name": "time"}),                                         # arguments missing
    hermes(PARIS) + "\nand some text",
    hermes(PARIS)[:-3],                                               # unfinished
    '<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>',   # free whitespace
])
def test_required_rejects_what_is_not_a_valid_call(accepts, text):
    assert not accepts(grammar({"tool_choice": "required"}), text)


def test_one_call_without_parallel_calls_or_with_a_named_function(accepts):
    one = grammar({"tool_choice": "required", "parallel_tool_calls": False})
    assert accepts(one, hermes(ROME)) and not accepts(one, hermes(ROME, NOW))
    named = grammar({"tool_choice": {"type": "function", "function": {"name": "time"}}})
    assert accepts(named, hermes(NOW))
    assert not accepts(named, hermes(PARIS)) and not accepts(named, hermes(NOW, NOW))


def test_llama3_calls(accepts):
    g = grammar({"tool_choice": "required"}, LLAMA3)
    as_llama = [{"name": c["name"], "parameters": c["arguments"]} for c in (PARIS, NOW)]
    text = llama(*as_llama)
    assert accepts(g, text)
    assert [c.name for c in parse(LLAMA3, text)[1]] == ["get_weather", "time"]
    assert not accepts(g, llama(PARIS))   # "arguments" is not Llama 3's key
    assert not accepts(g, hermes(PARIS))


def test_a_schema_with_defs_keeps_its_references(accepts):
    tool = fn("add", parameters={
        "type": "object", "$defs": {"n": {"type": "integer"}},
        "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]})
    g = tool_ask({"tools": [tool], "tool_choice": "required"}).structured_outputs(HERMES)
    assert accepts(g["grammar"], hermes({"name": "add", "arguments": {"a": 2}}))
    assert not accepts(g["grammar"], hermes({"name": "add", "arguments": {"a": "2"}}))


# ------------------------------------------------------------------ the request


class FakeChat:
    """What parse_chat needs of a ChatTemplate: its rendering and its tool format."""
    tool_format = HERMES

    def __init__(self):
        self.seen = None

    def prompt(self, messages, options=None, tools=None):
        self.seen = (messages, tools)
        return ChatPrompt("prompt")


def chat_body(**kw) -> dict:
    return {"messages": USER, "max_tokens": 8, **kw}


def test_required_puts_the_grammar_on_the_request():
    chat = FakeChat()
    gen = parse_chat(chat_body(tools=[WEATHER], tool_choice="required"), None, chat, 64, 64)
    assert chat.seen[1] == (WEATHER,)
    assert gen.msg.structured_outputs["grammar"].startswith("start: call")
    auto = parse_chat(chat_body(tools=[WEATHER]), None, FakeChat(), 64, 64)
    assert auto.msg.structured_outputs is None and auto.tools.choice == "auto"


def test_required_with_another_constraint_is_a_400():
    body = chat_body(tools=[WEATHER], tool_choice="required",
                     response_format={"type": "json_object"})
    with pytest.raises(ApiError) as e:
        parse_chat(body, None, FakeChat(), 64, 64)
    assert e.value.param == "tool_choice"
    body["response_format"] = {"type": "text"}
    assert parse_chat(body, None, FakeChat(), 64, 64).msg.structured_outputs


def test_a_chat_request_fits_its_calls_to_its_max_tokens():
    """parse_chat gives the tool grammar the request's max_tokens as its budget
    (tests/frontend/test_tool_finish.py checks the fit itself)."""
    email = {"type": "function", "function": {"name": "send_email", "parameters": {
        "type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}}}}
    grammars = {}
    for max_tokens in (600, 6000):
        body = {"messages": [{"role": "user", "content": "mail"}], "tools": [email],
                "tool_choice": "required", "max_tokens": max_tokens}
        gen = parse_chat(body, None, FakeChat(), 8192, 8192)
        grammars[max_tokens] = gen.msg.structured_outputs["grammar"]
    for max_tokens, grammar in grammars.items():
        step = budget_step(max_tokens)
        bound = string_bound(email["function"], most_calls(True, step), step)
        assert f'"maxLength": {bound}' in grammar, max_tokens
    assert grammars[600] != grammars[6000]


HISTORY = USER + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


def test_tool_messages_are_checked_and_reach_the_template_as_hugging_face_shapes():
    chat = FakeChat()
    parse_chat(chat_body(messages=HISTORY, tools=[WEATHER]), None, chat, 64, 64)
    messages = chat.seen[0]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}
    bad = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(ApiError) as e:
        parse_chat(chat_body(messages=bad), None, FakeChat(), 64, 64)
    assert e.value.param == "messages"


@pytest.fixture(scope="module")
def chatml(tmp_path_factory) -> ChatTemplate:
    from tests.fake_core import make_byte_tokenizer
    return ChatTemplate.load(make_byte_tokenizer(tmp_path_factory.mktemp("tok") / "t"))


def test_a_template_without_tools_gets_the_hermes_form(chatml):
    assert chatml.tool_format == HERMES
    text = chatml.render(fields.messages(HISTORY), tools=[WEATHER])
    assert text.startswith("<|im_start|>system\nYou are a function calling AI model.")
    assert json.dumps(WEATHER) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert chatml.render(USER) == "<|im_start|>user\nWeather in Paris?<|im_end|>\n" \
                                  "<|im_start|>assistant\n"   # no tools: as before


def test_a_template_that_knows_tools_gets_them(chatml):
    own = ChatTemplate(chatml.tokenizer, builtin=False)
    saved = chatml.tokenizer.chat_template
    try:
        own.tokenizer.chat_template = (
            "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
            "{% for m in messages %}{{ m.role }}:{{ m.content }}"
            "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}"
            "|{% endfor %}")
        assert own.render(fields.messages(HISTORY), tools=[WEATHER, TIME]) == (
            '[get_weather][time]user:Weather in Paris?|assistant:{"city": "Paris"}|'
            "tool:sunny, 21 C|")
    finally:
        chatml.tokenizer.chat_template = saved


# ------------------------------------------------------------------ the replies


def _gen(**kw):
    return parse_chat(chat_body(tools=[WEATHER, TIME], **kw), None, FakeChat(), 64, 64)


def _tally(text: str, finish: str = "stop") -> Tally:
    t = Tally(0.0)
    t.add(Delta("r", text, [1], finish), 0.0)
    return t


def test_a_reply_with_calls():
    gen = _gen()
    fmt = ToolChatFormat("m", gen, None, HERMES)
    choice = fmt.body([_tally("Let me see.\n" + hermes(PARIS, NOW))])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Let me see."
    assert [c["function"] for c in msg["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"name": "time", "arguments": "{}"}]
    assert [c["id"] for c in msg["tool_calls"]] == [
        call_id(gen.msg.request_id, 0, k) for k in range(2)]
    assert all(c["type"] == "function" for c in msg["tool_calls"])
    only = fmt.body([_tally(hermes(NOW))])["choices"][0]
    assert only["message"]["content"] is None
    plain = fmt.body([_tally("Just text.")])["choices"][0]
    assert plain == {"index": 0, "message": {"role": "assistant", "content": "Just text."},
                     "logprobs": None, "finish_reason": "stop"}
    # cut inside a second call: the first is kept, nothing of the second is anywhere
    cut = fmt.body([_tally(hermes(NOW) + "\n<tool_call>\n{", "length")])["choices"][0]
    assert cut["finish_reason"] == "length"
    assert cut["message"]["content"] is None and len(cut["message"]["tool_calls"]) == 1
    alone = fmt.body([_tally('<tool_call>\n{"name": "ti', "length")])["choices"][0]
    assert alone["message"] == {"role": "assistant", "content": ""}


def test_call_ids_are_the_request_id_s_and_differ_by_choice_and_index():
    assert call_id("a", 0, 0) == call_id("a", 0, 0)
    assert len({call_id("a", 0, 0), call_id("a", 0, 1), call_id("a", 1, 0),
                call_id("b", 0, 0)}) == 4


def test_without_parallel_calls_only_the_first_is_kept():
    fmt = ToolChatFormat("m", _gen(parallel_tool_calls=False), None, HERMES)
    msg = fmt.body([_tally(hermes(PARIS, NOW))])["choices"][0]["message"]
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]


def test_tool_choice_none_reads_nothing():
    gen = _gen(tool_choice="none")
    fmt = chat_format("m", gen, None, FakeChat())
    assert not isinstance(fmt, ToolChatFormat)
    assert isinstance(chat_format("m", _gen(), None, FakeChat()), ToolChatFormat)


def _accumulate(chunks: list[dict]) -> tuple[str | None, list[dict], str]:
    """What the openai SDK makes of a stream's deltas."""
    content, calls, finish = "", {}, None
    for ch in chunks:
        c = ch["choices"][0]
        d = c["delta"]
        content += d.get("content") or ""
        for tc in d.get("tool_calls", ()):
            got = calls.setdefault(tc["index"], {"id": None, "type": None,
                                                 "function": {"name": "", "arguments": ""}})
            got["id"] = tc.get("id") or got["id"]
            got["type"] = tc.get("type") or got["type"]
            got["function"]["name"] += tc["function"].get("name") or ""
            got["function"]["arguments"] += tc["function"].get("arguments") or ""
        finish = c["finish_reason"] or finish
    return content or None, [calls[k] for k in sorted(calls)], finish


@pytest.mark.parametrize("text", [
    hermes(PARIS, NOW), "Let me see.\n" + hermes(ROME) + "\n", "No tools needed.",
    "<tool_call>broken</tool_call>", hermes(PARIS) + "\n<tool_call>\n{"])
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_stream_adds_up_to_the_whole_reply(text, size):
    gen = _gen()
    whole = ToolChatFormat("m", gen, None, HERMES).body([_tally(text)])["choices"][0]
    fmt = ToolChatFormat("m", gen, None, HERMES)
    tallies = [Tally(0.0)]
    pieces = [text[k:k + size] for k in range(0, len(text), size)] or [""]
    chunks = []
    for n, piece in enumerate(pieces):
        d = Delta("r", piece, [1], "stop" if n == len(pieces) - 1 else None)
        tallies[0].add(d, 0.0)
        chunk = fmt.chunk(tallies, 0, d)
        if chunk is not None:
            chunks.append(chunk)
    content, calls, finish = _accumulate(chunks)
    assert finish == whole["finish_reason"]
    assert content == whole["message"]["content"] or (content is None and not whole[
        "message"]["content"])
    assert calls == whole["message"].get("tool_calls", [])
