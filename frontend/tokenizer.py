"""The model's tokenizer as the frontend uses it: a local HF directory, never a download."""
from __future__ import annotations

import os
from typing import Sequence

from frontend.detok import Detokenizer, StreamDetokenizer
from frontend.token_bound import TokenBound


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Tokenizer:
    def __init__(self, hf):
        self._hf = hf
        self._rust = _rust_decode(hf)
        # its own streaming decoder where decode is the library's alone (frontend/detok.py)
        self._stream_tok = None if self._rust is None else hf._tokenizer
        self.bound = TokenBound.of(hf)   # the fewest tokens a text can be (token_bound.py)

    @staticmethod
    def preload() -> None:
        """Import transformers now (seconds), so that `load` is quick later."""
        _offline()
        from transformers import AutoTokenizer  # noqa: F401

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        if not path or not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
        _offline()
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """As `tokenizer(text)` does by default (a Llama's BOS included); a chat-templated
        prompt, whose template wrote its own special tokens, comes with False."""
        return list(self._hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._rust is not None:
            return self._rust(list(ids), skip_special_tokens=skip_special_tokens)
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decoder(self, skip_special_tokens: bool):
        """decode with the flag bound, for one request's detokenizer."""
        return self.decode if skip_special_tokens else self._decode_all

    def detokenizer(self, skip_special_tokens: bool, prompt_ids: Sequence[int]):
        """A request's incremental decoder (frontend/detok.py): push ids, get text."""
        if self._stream_tok is not None:
            return StreamDetokenizer(self._stream_tok, skip_special_tokens, prompt_ids)
        return Detokenizer(self.decoder(skip_special_tokens), prompt_ids)

    def _decode_all(self, ids: Sequence[int]) -> str:
        return self.decode(ids, skip_special_tokens=False)


def _rust_decode(hf):
    """The `tokenizers` library's own decode, where `hf.decode` adds nothing to it: a fast
    tokenizer whose class overrides neither decode step and that cleans up no spaces. The
    frontend decodes twice per token (frontend/detok.py); the Python layers around the call
    took two thirds of that time. None elsewhere (hf.decode is used)."""
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    cls = type(hf)
    if (isinstance(hf, TokenizersBackend) and cls.decode is PreTrainedTokenizerBase.decode
            and cls._decode is TokenizersBackend._decode
            and not getattr(hf, "clean_up_tokenization_spaces", True)):
        return hf._tokenizer.decode
    return None
