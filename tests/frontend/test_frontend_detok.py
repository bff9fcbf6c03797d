"""Incremental detokenization equals a full decode, step by step, characters never split."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from frontend.detok import Detokenizer


def byte_decode(ids) -> str:
    """What a byte-level tokenizer's decode does: bytes, invalid UTF-8 as U+FFFD."""
    return bytes(ids).decode("utf-8", "replace")


WORDS = ["▁the", "▁cat", "s", "▁a", "t", "▁", "é", "▁€"]


def metaspace_decode(ids) -> str:
    """SentencePiece-like: "▁" is a space, and a decode drops the leading space."""
    text = "".join(WORDS[i] for i in ids).replace("▁", " ")
    return text[1:] if text.startswith(" ") else text


def run(decode, prompt, chunks) -> tuple[list[str], str]:
    d = Detokenizer(decode, prompt)
    pieces = [d.push(c) for c in chunks]
    return pieces, d.flush()


text_bytes = st.text(max_size=12).map(lambda s: list(s.encode()))
any_bytes = st.lists(st.integers(0, 255), max_size=24)
# Mostly valid UTF-8 with multibyte characters, sometimes raw (possibly invalid) bytes.
output = st.one_of(text_bytes, any_bytes,
                   st.lists(st.one_of(text_bytes, any_bytes), max_size=4).map(
                       lambda parts: [b for p in parts for b in p]))


def split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=300, deadline=None)
@given(prompt=text_bytes, out=output, cuts=st.lists(st.integers(0, 100), max_size=10))
def test_bytes_incremental_equals_full_decode(prompt, out, cuts):
    pieces, rest = run(byte_decode, prompt, split(out, cuts))
    assert "".join(pieces) + rest == byte_decode(out)


@settings(max_examples=200, deadline=None)
@given(out=output)
def test_one_token_per_step_never_splits_a_character(out):
    pieces, rest = run(byte_decode, [], [[b] for b in out])
    full = byte_decode(out)
    assert "".join(pieces) + rest == full
    if "\ufffd" not in full:
        assert all("\ufffd" not in p for p in pieces)


def test_multibyte_held_until_complete():
    d = Detokenizer(byte_decode, list(b"hi "))
    euro = list("€".encode())
    assert [d.push([b]) for b in euro] == ["", "", "€"]
    assert d.push(list(b"!")) == "!"
    assert d.flush() == ""


def test_incomplete_character_flushed_as_replacement():
    d = Detokenizer(byte_decode)
    assert d.push([0xE2, 0x82]) == ""
    assert d.flush() == "\ufffd"


def test_prompt_ending_inside_a_character_gives_no_context():
    d = Detokenizer(byte_decode, [0x61, 0xE2])
    assert d.push([0x82, 0xAC, 0x62]) == byte_decode([0x82, 0xAC, 0x62])


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, len(WORDS) - 1), min_size=1, max_size=8),
       out=st.lists(st.integers(0, len(WORDS) - 1), max_size=12),
       cuts=st.lists(st.integers(0, 100), max_size=6))
def test_context_dependent_decoder_matches_decode_with_prompt(prompt, out, cuts):
    pieces, rest = run(metaspace_decode, prompt, split(out, cuts))
    whole, head = metaspace_decode(prompt + out), metaspace_decode(prompt)
    assert "".join(pieces) + rest == whole[len(head):]


def test_the_tokenizers_own_decode_equals_transformers_decode():
    """frontend/tokenizer.py calls the `tokenizers` decode directly where transformers'
    decode adds nothing: the same text for every id, special or not, both flag values."""
    import random

    from frontend.tokenizer import Tokenizer
    from worker.presets import preset_dir
    for name in ("tiny", "smol"):
        tok = Tokenizer.load(str(preset_dir(name)))
        assert tok._rust is not None
        rng = random.Random(0)
        size = len(tok._hf)
        cases = [[i] for i in range(0, size, max(1, size // 500))] + [
            [rng.randrange(size) for _ in range(rng.randrange(12))] for _ in range(500)]
        for ids in cases:
            for skip in (True, False):
                assert tok.decode(ids, skip) == tok._hf.decode(ids, skip_special_tokens=skip)


def test_a_tokenizer_that_cleans_up_spaces_keeps_transformers_decode():
    from frontend.tokenizer import Tokenizer
    from worker.presets import preset_dir
    tok = Tokenizer.load(str(preset_dir("tiny")))
    tok._hf.clean_up_tokenization_spaces = True
    assert Tokenizer(tok._hf)._rust is None


def test_the_streaming_decoder_gives_the_windows_pieces():
    """StreamDetokenizer (the `tokenizers` library's DecodeStream) against Detokenizer over
    the same tokenizer's decode: the same text at every step and at the flush, for random
    ids (special ones included, both flag values) and for texts with multi-byte characters
    split across steps."""
    import random

    from frontend.detok import StreamDetokenizer
    from frontend.tokenizer import Tokenizer
    from worker.presets import preset_dir
    rng = random.Random(1)
    texts = ["naïve café € 日本語 🙂 x", "   spaced\n\nlines\ttabs", "ĀāĂă 👩‍👩‍👧 Ω≈ç√"]
    for name in ("tiny", "smol"):
        tok = Tokenizer.load(str(preset_dir(name)))
        assert isinstance(tok.detokenizer(True, []), StreamDetokenizer)
        size = len(tok._hf)
        outs = [tok.encode(t, add_special_tokens=False) for t in texts]
        outs += [[rng.randrange(size) for _ in range(rng.randrange(1, 30))] for _ in range(150)]
        for out in outs:
            prompt = [rng.randrange(size) for _ in range(rng.randrange(8))]
            chunks = split(out, [rng.randrange(100) for _ in range(rng.randrange(8))])
            for skip in (True, False):
                window = Detokenizer(tok.decoder(skip), prompt)
                stream = tok.detokenizer(skip, prompt)
                assert [stream.push(c) for c in chunks] == [window.push(c) for c in chunks]
                assert stream.flush() == window.flush()


def llama_like_tokenizer():
    """A SentencePiece-style `tokenizers.Tokenizer` (Llama's decoder: "▁" is a space, byte
    fallback, the leading space stripped): its text depends on the ids before."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models
    pieces = ["<unk>", "<s>", "</s>", "▁the", "▁cat", "s", "▁", "<0xE2>", "<0x82>", "<0xAC>", "a"]
    tok = RawTokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, "<unk>"))
    tok.add_special_tokens(["<s>", "</s>"])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok, len(pieces)


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, 10), max_size=8), out=st.lists(st.integers(0, 10), max_size=14),
       cuts=st.lists(st.integers(0, 100), max_size=8), skip=st.booleans())
# DecodeStream raises here: "<0xE2><0x82>" then "<0xE2>" and <unk> changes the text it gave
@example(prompt=[], out=[0, 0, 0, 0, 0, 7, 8, 8, 7, 0, 0, 0, 0, 0], cuts=[23], skip=False)
def test_the_streaming_decoder_keeps_context_like_the_window(prompt, out, cuts, skip):
    """Held-back ids at the end (an incomplete character after a "▁") flush with the ids
    before them, as the window does: decoded alone they would lose the space."""
    from frontend.detok import StreamDetokenizer
    tok, _ = llama_like_tokenizer()
    window = Detokenizer(lambda ids: tok.decode(list(ids), skip_special_tokens=skip), prompt)
    stream = StreamDetokenizer(tok, skip, prompt)
    chunks = split(out, cuts)
    assert [stream.push(c) for c in chunks] == [window.push(c) for c in chunks]
    assert stream.flush() == window.flush()
