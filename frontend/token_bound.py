"""The fewest tokens a text can become, known before tokenizing it.

No token of the vocabulary spells more than L bytes (L: the longest token string's UTF-8
length, computed once at load), so a text of B bytes is at least ceil(B / L) tokens. A
prompt whose bound already reaches max_model_len is refused without tokenizing any of it:
a 1 MB prompt cost the frontend's loop 0.8 s to tokenize before the length check refused it.

The token strings overstate what a token covers (ByteLevel's stand-in chars take 1-2 bytes
for one, Metaspace's "▁" three for a space, byte fallback's "<0x0A>" six for one), which
only loosens the bound. It must never be tighter than the truth, so it is measured on the
tokenizer's normalized text (a normalizer such as NFC can shrink it), and it is not used
(`at_least` is 0) where one token can stand for more than its string: a pre-tokenizer that
drops text (whitespace splitters, a Split that removes), a model with an unknown token that
can swallow a run of text (WordPiece, WordLevel, Unigram, BPE fusing unknowns), or a
tokenizer without a `tokenizers` backend.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from frontend.validate import InvalidField

DROPS_TEXT = frozenset({"Whitespace", "WhitespaceSplit", "BertPreTokenizer",
                        "CharDelimiterSplit"})
MAX_CHAR_BYTES = 4   # an unknown token of BPE without fusing covers one character


@dataclass(frozen=True)
class TokenBound:
    max_token_bytes: int | None                 # L; None: no bound for this tokenizer
    normalize: Callable[[str], str] | None = None

    @classmethod
    def of(cls, hf) -> TokenBound:
        """From a Hugging Face tokenizer (its vocabulary and its backend's pipeline)."""
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            return cls(None)
        spec = json.loads(backend.to_str())
        if not (_model_keeps_text(spec.get("model") or {})
                and _pre_keeps_text(spec.get("pre_tokenizer"))):
            return cls(None)
        longest = max((len(t.encode("utf-8", "surrogatepass")) for t in hf.get_vocab()),
                      default=1)
        norm = backend.normalizer
        return cls(max(longest, MAX_CHAR_BYTES), None if norm is None else norm.normalize_str)

    def at_least(self, text: str) -> int:
        """A lower bound on len(tokenize(text)) (0 where none is known)."""
        if self.max_token_bytes is None:
            return 0
        if self.normalize is not None:
            text = self.normalize(text)
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.max_token_bytes)


def check_prompt_text(bound: TokenBound, text: str, max_model_len: int,
                      max_tokens: int | None = None) -> None:
    """Refuse (400) a prompt text whose bound already fails check_prompt_ids: it reaches
    max_model_len, or with `max_tokens` (a request whose max_tokens must fit) leaves no
    room for them."""
    least = bound.at_least(text)
    why = (f"prompt of {len(text)} characters is at least {least} tokens (no token of this "
           f"tokenizer spells more than {bound.max_token_bytes} bytes)")
    if least >= max_model_len:
        raise InvalidField(f"{why}, which reaches max_model_len {max_model_len}", "prompt")
    if max_tokens is not None and least + max_tokens > max_model_len:
        raise InvalidField(f"{why}; + max_tokens {max_tokens} is over max_model_len "
                             f"{max_model_len}", "max_tokens")


def _model_keeps_text(model: dict) -> bool:
    if model.get("type") != "BPE":
        return False
    return model.get("unk_token") is None or bool(model.get("byte_fallback")) \
        or not model.get("fuse_unk")


def _pre_keeps_text(pre: dict | None) -> bool:
    if pre is None:
        return True
    if pre.get("type") == "Sequence":
        return all(map(_pre_keeps_text, pre.get("pretokenizers") or ()))
    return pre.get("type") not in DROPS_TEXT and pre.get("behavior") != "Removed"
