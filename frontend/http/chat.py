"""Chat messages -> prompt text, with the served model's own chat template.

The tokenizer comes from the directory the worker reported (stats()["tokenizer"]; "null"
reports the tiny preset's). A tokenizer without a chat template gets a built-in ChatML one
(core/chatml.py: the presets ship the same one).
"""
from __future__ import annotations

import os

from core.chatml import CHATML_TEMPLATE
from frontend.http.errors import ApiError
from frontend.http.tool_messages import (has_tool_parts, hermes_messages, knows_tools,
                                          tool_format)


class ChatTemplate:
    def __init__(self, hf_tokenizer, builtin: bool):
        self._hf = hf_tokenizer
        self.builtin = builtin  # True when the tokenizer had no template of its own

    @classmethod
    def load(cls, tokenizer_dir: str) -> ChatTemplate:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(tokenizer_dir)
        builtin = not getattr(hf, "chat_template", None)
        if builtin:
            hf.chat_template = CHATML_TEMPLATE
        return cls(hf, builtin)

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

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list | None = None) -> str:
        """`tools`: the body's, in OpenAI's shape; a template that does not read them gets
        the conversation in the Hermes format (tool_messages.py)."""
        from jinja2 import TemplateError
        kw = {}
        if not knows_tools(self.template):
            if tools or has_tool_parts(messages):
                messages = hermes_messages(messages, tools)
        elif tools:
            kw["tools"] = list(tools)
        try:
            return self._hf.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=add_generation_prompt,
                                                **kw)
        except (TemplateError, ValueError) as e:  # e.g. the template's raise_exception
            raise ApiError(400, f"the chat template refused the messages: {e}",
                           "messages") from None
