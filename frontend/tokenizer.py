"""The model's tokenizer as the frontend uses it: a local HF directory, never a download."""
from __future__ import annotations

import os
from typing import Sequence


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Tokenizer:
    def __init__(self, hf):
        self._hf = hf

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

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        # Special tokens stay visible; only the EOS that ends a request is dropped, by
        # the request itself.
        return self._hf.decode(list(ids), skip_special_tokens=False)
