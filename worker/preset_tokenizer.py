"""A byte-level tokenizer that needs no download: ids 0..255 are the bytes, then specials,
then placeholder tokens up to the vocabulary size, so every id decodes."""
from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, processors
from tokenizers.pre_tokenizers import ByteLevel

from core.chatml import CHATML_TEMPLATE

EOS = "<|endoftext|>"
SPECIALS = (EOS, "<|im_start|>", "<|im_end|>")
EOS_ID = 256  # the first special, right after the 256 bytes
NUM_FIXED = 256 + len(SPECIALS)
BOS = "<|startoftext|>"  # only with bos=True: id BOS_ID, prepended to every encoding
BOS_ID = NUM_FIXED


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


def build_tokenizer(vocab_size: int, bos: bool = False) -> Tokenizer:
    specials = (*SPECIALS, BOS) if bos else SPECIALS
    fixed = 256 + len(specials)
    if vocab_size < fixed:
        raise ValueError(f"vocab_size must be at least {fixed}")
    vocab = {ch: b for b, ch in _byte_chars().items()}
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
    # Placeholders are plain vocabulary entries (no merges produce them): they only decode.
    for i in range(fixed, vocab_size):
        vocab[f"<|extra_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)])
    return tok


def save_tokenizer(vocab_size: int, path: str, bos: bool = False) -> None:
    """Write tokenizer.json, tokenizer_config.json and the chat template into `path`."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(vocab_size, bos),
                                 eos_token=EOS, pad_token=EOS, bos_token=BOS if bos else None)
    hf.chat_template = CHATML_TEMPLATE
    hf.save_pretrained(path)
