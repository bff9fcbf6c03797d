"""Chat messages -> prompt text, with the served model's own chat template.

The tokenizer comes from the directory the worker reported (stats()["tokenizer"]; "null"
reports the tiny preset's). A tokenizer without a chat template gets a built-in ChatML one
(core/chatml.py: the presets ship the same one).

Roles are checked (chat_roles.py), and a special token's text inside a user string is read
as text, not as a control token (chat_special.py), unless the operator passed
`--allow-special-tokens`.
"""
from __future__ import annotations

import os
from dataclasses import replace

from core.chatml import CHATML_TEMPLATE
from frontend.http.chat_options import ChatOptions
from frontend.http.chat_roles import check_roles, template_roles
from frontend.http.chat_special import ChatPrompt, Marks, prompt_ids, special_texts
from frontend.http.errors import ApiError
from frontend.http.render_bound import RenderTimeout, TemplateRefused, bounded
from frontend.http.tool_messages import (has_tool_parts, hermes_messages, knows_tools,
                                          tool_format)


PLAIN = ChatOptions()   # a generation prompt after the messages, no template variables


class ChatTemplate:
    def __init__(self, hf_tokenizer, builtin: bool, allow_special_tokens: bool = False):
        self._hf = hf_tokenizer
        self.builtin = builtin  # True when the tokenizer had no template of its own
        # the operator's --allow-special-tokens: user strings' special tokens stay control tokens
        self.allow_special_tokens = allow_special_tokens
        self._specials = () if allow_special_tokens else special_texts(hf_tokenizer)

    @classmethod
    def load(cls, tokenizer_dir: str, allow_special_tokens: bool = False) -> ChatTemplate:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(tokenizer_dir)
        builtin = not getattr(hf, "chat_template", None)
        if builtin:
            hf.chat_template = CHATML_TEMPLATE
        chat = cls(hf, builtin, allow_special_tokens)
        chat.dry_render()
        return chat

    def dry_render(self) -> None:
        """TemplateRefused in one line where the template cannot render one user message within
        its bounds (render_bound.py): such a template would fail every chat."""
        try:
            self.render([{"role": "user", "content": "Hello"}])
        except ApiError as e:
            raise TemplateRefused(f"the chat template cannot render a one-message chat: "
                                  f"{e.message}") from None

    @property
    def template(self) -> str:
        """The chat template in use (the tokenizer's, else the built-in ChatML one)."""
        return self._hf.chat_template

    @property
    def tokenizer(self):
        """The served model's Hugging Face tokenizer (the engine's, from the same directory)."""
        return self._hf

    @property
    def tool_format(self) -> str:
        """The format its model writes tool calls in (frontend/tool_parsers.py)."""
        return tool_format(self.template)

    @property
    def roles(self) -> frozenset[str]:
        return template_roles(self.template)

    def prompt(self, messages: list[dict], options: ChatOptions = PLAIN,
               tools: list | None = None) -> ChatPrompt:
        """The prompt, with where a user string (or a chat_template_kwargs string) spelled
        a special token (none where the operator allows them)."""
        messages = check_roles(messages, self.roles)
        marks = Marks.of(self._specials) if self._specials else None
        kwargs = options.template_kwargs
        if marks is None or not (marks.holds(messages) or marks.holds(tools)
                                 or marks.holds(kwargs)):
            return ChatPrompt(self._render(messages, options, tools))
        hidden = replace(options, template_kwargs={k: marks.hide(v) for k, v in kwargs.items()})
        return marks.show(self._render(marks.hide_messages(messages), hidden,
                                       marks.hide(tools) if tools else tools))

    def ids(self, prompt: ChatPrompt, add_special_tokens: bool = False) -> list[int]:
        """The prompt's token ids, its forged special tokens read as text (chat_special.py)."""
        return prompt_ids(self._hf, prompt, add_special_tokens)

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list | None = None) -> str:
        """The prompt's text, as the template writes it (roles checked)."""
        return self._render(check_roles(messages, self.roles),
                            ChatOptions(add_generation_prompt), tools)

    def _render(self, messages: list[dict], options: ChatOptions, tools: list | None) -> str:
        """`tools`: the body's, in OpenAI's shape; a template that does not read them gets
        the conversation in the Hermes format (tool_messages.py). With
        continue_final_message the text ends where the last message's content does
        (transformers cuts the template's end-of-turn, as vLLM renders it)."""
        from jinja2 import TemplateError
        kw = dict(options.template_kwargs)
        if not knows_tools(self.template):
            if tools or has_tool_parts(messages):
                messages = hermes_messages(messages, tools)
        elif tools:
            kw["tools"] = list(tools)
        try:
            return bounded(lambda: self._hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message, **kw))
        except (TemplateError, ValueError) as e:  # e.g. the template's raise_exception
            raise ApiError(400, f"the chat template refused the messages: {e}",
                           "messages") from None
        except RenderTimeout as e:
            raise ApiError(500, str(e)) from None
        except Exception as e:  # noqa: BLE001  the template is a program: one line, no trace
            if options.template_kwargs:   # it renders without them (dry_render): theirs
                raise ApiError(400, f"the chat template failed on chat_template_kwargs "
                                    f"({type(e).__name__}: {str(e)[:200]})",
                               "chat_template_kwargs") from None
            raise ApiError(500, f"the chat template failed ({type(e).__name__}: "
                                f"{str(e)[:200]})") from None
