"""A byte-level tokenizer that needs no download: ids 0..255 are the bytes, then specials,
then placeholder tokens up to the vocabulary size, so every id decodes."""
from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel

from core.chatml import CHATML_TEMPLATE

EOS = "<|endoftext|>"
SPECIALS = (EOS, "<|im_start|>", "<|im_end|>")
EOS_ID = 256  # the first special, right after the 256 bytes
NUM_FIXED = 256 + len(SPECIALS)


def _byte_chars() -> dict[int, str]:
    """GPT-2's bytes_to_unicode: the printable stand-in char of every byte (what ByteLevel uses)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build_tokenizer(vocab_size: int) -> Tokenizer:
    if vocab_size < NUM_FIXED:
        raise ValueError(f"vocab_size must be at least {NUM_FIXED}")
    vocab = {ch: b for b, ch in _byte_chars().items()}
    for i, s in enumerate(SPECIALS):
        vocab[s] = 256 + i
    # Placeholders are plain vocabulary entries (no merges produce them): they only decode.
    for i in range(NUM_FIXED, vocab_size):
        vocab[f"<|extra_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def save_tokenizer(vocab_size: int, path: str) -> None:
    """Write tokenizer.json, tokenizer_config.json and the chat template into `path`."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(vocab_size), eos_token=EOS,
                                 pad_token=EOS, bos_token=None)
    hf.chat_template = CHATML_TEMPLATE
    hf.save_pretrained(path)
