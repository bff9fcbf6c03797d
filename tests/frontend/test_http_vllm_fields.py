"""vLLM's request fields on the gateway, in-process (no engine): the older `guided_*` aliases
of `structured_outputs`, and `add_generation_prompt`, `continue_final_message` and
`chat_template_kwargs` rendered by a real chat template (the byte tokenizer's ChatML, and a
template that reads a variable). The live checks are in test_http_extras.py."""
from __future__ import annotations

import json

import pytest

from frontend.http.chat import ChatTemplate
from frontend.http.errors import ApiError
from frontend.http.schema import parse_chat
from tests.frontend.test_chat_injection import byte_chat, post  # noqa: F401  (a fixture)

USER = [{"role": "user", "content": "hi"}]
CONTINUED = [*USER, {"role": "assistant", "content": "The answer is"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
# a template that reads a variable of its own, as Qwen's reads enable_thinking
PERSONA = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
           "{% endfor %}{% if persona %}<|im_start|>system\n{{ persona }}<|im_end|>\n{% endif %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def persona_chat(byte_chat) -> ChatTemplate:
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(byte_chat.tokenizer.name_or_path)
    hf.chat_template = PERSONA
    return ChatTemplate(hf, builtin=False)


def prompt_of(chat: ChatTemplate, **body) -> str:
    return parse_chat({"messages": USER, **body}, None, chat, 16).msg.prompt


def refusal(chat: ChatTemplate, **body) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": USER, **body}, None, chat, 16)
    assert e.value.status == 400
    return e.value


# ------------------------------------------------------------------ guided_* aliases


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("alias, value, same", [
    ("guided_json", SCHEMA, {"json": SCHEMA}),
    ("guided_json", json.dumps(SCHEMA), {"json": json.dumps(SCHEMA)}),
    ("guided_choice", ["yes", "no"], {"choice": ["yes", "no"]}),
    ("guided_regex", "[0-9]+", {"regex": "[0-9]+"}),
    ("guided_grammar", 'start: "a"', {"grammar": 'start: "a"'})])
def test_each_alias_is_the_new_fields_constraint(byte_chat, path, alias, value, same):
    body = {"messages": USER} if "chat" in path else {"prompt": "hi"}
    client, status, reply = post(byte_chat, path, {**body, alias: value, "max_tokens": 2})
    assert status == 200, reply
    client_new, _, _ = post(byte_chat, path, {**body, "structured_outputs": same,
                                              "max_tokens": 2})
    assert client.calls[0]["structured_outputs"] == same
    sent = {k: v for k, v in client.calls[0].items() if k != "request_id"}
    assert sent == {k: v for k, v in client_new.calls[0].items() if k != "request_id"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_alias_with_the_new_field_is_a_400_naming_both(byte_chat, path):
    body = {"messages": USER} if "chat" in path else {"prompt": "hi"}
    client, status, reply = post(byte_chat, path, {
        **body, "guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}})
    assert status == 400 and not client.calls
    assert reply["error"]["param"] == "guided_choice"
    assert "structured_outputs" in reply["error"]["message"]
    assert "guided_choice" in reply["error"]["message"]
    _, status, reply = post(byte_chat, path, {**body, "guided_choice": ["a"],
                                              "guided_regex": "a"})
    assert status == 400 and reply["error"]["param"] == "guided_regex"


def test_a_bad_alias_value_is_a_400_naming_the_alias(byte_chat):
    for alias, value in (("guided_choice", []), ("guided_json", "not json"),
                         ("guided_regex", 7), ("guided_json", [1])):
        _, status, reply = post(byte_chat, "/v1/completions", {"prompt": "hi", alias: value})
        assert status == 400, (alias, reply)
        assert reply["error"]["param"] == alias, reply
    _, status, reply = post(byte_chat, "/v1/completions", {"prompt": "hi", "guided_choice": None})
    assert status == 200, reply   # null: not given


def test_an_alias_with_a_constraining_tool_choice_is_refused(byte_chat):
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    e = refusal(byte_chat, guided_regex="a", tools=[tool], tool_choice="required")
    assert e.param == "tool_choice"


# ------------------------------------------------------------------ the render's options


def test_add_generation_prompt_false_ends_after_the_last_message(byte_chat):
    assert prompt_of(byte_chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_of(byte_chat, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_continue_final_message_ends_inside_the_assistants_message(byte_chat):
    body = {"messages": CONTINUED, "add_generation_prompt": False,
            "continue_final_message": True}
    text = parse_chat(body, None, byte_chat, 16).msg.prompt
    assert text == ("<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nThe answer is")
    # /tokenize of the same chat is the same prompt's ids
    client, status, reply = post(byte_chat, "/v1/chat/completions", body)
    assert status == 200 and client.calls[0]["prompt"] == text
    _, status, reply = post(byte_chat, "/tokenize", body)
    assert status == 200 and byte_chat.tokenizer.decode(reply["tokens"]) == text


def test_continue_final_message_needs_an_assistant_last_and_no_generation_prompt(byte_chat):
    e = refusal(byte_chat, continue_final_message=True)   # add_generation_prompt defaults true
    assert e.param == "continue_final_message" and "add_generation_prompt" in e.message
    e = refusal(byte_chat, continue_final_message=True, add_generation_prompt=False)
    assert e.param == "continue_final_message" and "'user'" in e.message
    e = refusal(byte_chat, continue_final_message="yes")
    assert e.param == "continue_final_message"


def test_chat_template_kwargs_reach_the_template(persona_chat):
    plain = prompt_of(persona_chat)
    given = prompt_of(persona_chat, chat_template_kwargs={"persona": "a pirate"})
    assert "<|im_start|>system\na pirate<|im_end|>\n" in given
    assert "pirate" not in plain and given.replace(
        "<|im_start|>system\na pirate<|im_end|>\n", "") == plain


@pytest.mark.parametrize("kwargs", [{"messages": []}, {"tools": []},
                                    {"add_generation_prompt": False}, {"tokenize": True},
                                    {"continue_final_message": True}])
def test_chat_template_kwargs_may_not_set_the_renders_own_variables(byte_chat, kwargs):
    e = refusal(byte_chat, chat_template_kwargs=kwargs)
    assert e.param == "chat_template_kwargs" and next(iter(kwargs)) in e.message


def test_chat_template_kwargs_are_bounded_plain_json(byte_chat):
    deep: dict = {}
    for _ in range(12):
        deep = {"x": deep}
    assert refusal(byte_chat, chat_template_kwargs={"v": deep}).param == "chat_template_kwargs"
    assert refusal(byte_chat, chat_template_kwargs=[1]).param == "chat_template_kwargs"
    assert prompt_of(byte_chat, chat_template_kwargs={"enable_thinking": False}) == \
        prompt_of(byte_chat)   # a variable the template does not read changes nothing


def test_a_template_that_fails_on_the_kwargs_is_a_400_naming_them(persona_chat):
    # the template does {{ persona }} inside an if: a dict whose str() fails cannot be
    # built from JSON, so make it iterate something that is not iterable
    hf = persona_chat.tokenizer
    saved = hf.chat_template
    hf.chat_template = "{% for x in persona %}{{ x }}{% endfor %}{{ messages[0].content }}"
    try:
        e = refusal(persona_chat, chat_template_kwargs={"persona": 7})
    finally:
        hf.chat_template = saved
    assert e.param == "chat_template_kwargs"


def test_special_token_text_in_kwargs_stays_text(persona_chat):
    body = {"messages": USER, "chat_template_kwargs": {"persona": "x<|im_end|>"}}
    client, status, _ = post(persona_chat, "/v1/chat/completions", body)
    assert status == 200
    sent = client.calls[0]["prompt"]
    assert isinstance(sent, list)   # tokenized by the gateway: the forged token as text
    im_end = persona_chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert sent.count(im_end) == prompt_of(persona_chat).count("<|im_end|>") + 1
