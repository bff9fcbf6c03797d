"""How a chat body asks its template to be rendered: vLLM's `add_generation_prompt`,
`continue_final_message` and `chat_template_kwargs`, checked into one ChatOptions.

`chat_template_kwargs` become variables of the template's render (a template's
`enable_thinking`, a date, a persona). They are bounded: plain JSON values only, and no key
that would replace what the render itself sets (the messages, the tools, the generation
prompt switch) or collide with apply_chat_template's own parameters (a TypeError deep in
transformers otherwise). Their strings are rendered as a user's are: a special token's text
in them stays text (chat.py, chat_special.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from frontend.http.errors import ApiError
from frontend.http.fields import BOOL, OBJ, get
from frontend.plain_json import plain_problem

FIELDS = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
# the render's own variables, then apply_chat_template's parameters (transformers 4.4x-5.x)
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                      "conversation", "documents", "chat_template", "tokenize", "padding",
                      "truncation", "max_length", "return_tensors", "return_dict",
                      "return_assistant_tokens_mask", "tokenizer_kwargs", "kwargs"})
MAX_KWARGS_DEPTH = 8   # a template variable is a flag, a string or a small structure


@dataclass(frozen=True)
class ChatOptions:
    add_generation_prompt: bool = True
    # the prompt ends inside the last (assistant) message: the model continues it
    continue_final_message: bool = False
    template_kwargs: dict = field(default_factory=dict)


def chat_options(body: dict, messages: list[dict]) -> ChatOptions:
    """The body's options for rendering `messages` (checked already), or a 400 naming the
    field at fault."""
    add = get(body, "add_generation_prompt", BOOL, True)
    cont = get(body, "continue_final_message", BOOL, False)
    if cont and add:
        raise ApiError(400, "continue_final_message: true needs add_generation_prompt: false "
                            "(the prompt ends inside the last message, not after it)",
                       "continue_final_message")
    if cont and messages[-1]["role"] != "assistant":
        raise ApiError(400, "continue_final_message: true needs the last message to be the "
                            f"assistant's, not {messages[-1]['role'][:40]!r}",
                       "continue_final_message")
    return ChatOptions(add, cont, template_kwargs(body))


def template_kwargs(body: dict) -> dict:
    kwargs = get(body, "chat_template_kwargs", OBJ, {})
    why = plain_problem(kwargs, MAX_KWARGS_DEPTH)
    if why is not None:
        raise ApiError(400, f"chat_template_kwargs{why}", "chat_template_kwargs")
    taken = sorted(RESERVED & set(kwargs))
    if taken:
        raise ApiError(400, f"chat_template_kwargs may not set {taken[0]!r}: the render sets "
                            "it (give it as its own field where it is one)",
                       "chat_template_kwargs")
    return kwargs
