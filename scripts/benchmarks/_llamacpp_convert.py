"""Convert a preset checkpoint to GGUF f32 with llama.cpp's own convert_hf_to_gguf.py.

    python -m scripts.benchmarks._llamacpp_convert LLAMA_CPP_SRC HF_DIR OUT.gguf

Run as a subprocess (the converter's modules come from the llama.cpp tree). The presets'
byte-level tokenizer (worker/preset_tokenizer.py) is no tokenizer the converter knows: it
would try sentencepiece, then hash the BPE pre-tokenizer and refuse the unknown hash. The
benchmark sends token ids only, so the vocabulary is written as a plain GPT-2-style BPE
vocabulary with the "default" pre-tokenizer; every id keeps its token text and type, and
the weights go through the converter untouched (docs/design/benchmarks.md, "llama.cpp as a peer").
"""
from __future__ import annotations

import sys


def ascii_lead_bytes(tokens: list[str]) -> list[str]:
    """Single-byte tokens of bytes 0xC0-0xFF renamed to ASCII text. llama-server holds back
    a streamed token whose text ends in an unfinished UTF-8 sequence and then never streams
    its id; random-weight models emit such bytes, so their ids would go missing. Only the
    text changes: ids, types and weights stay."""
    from worker.preset_tokenizer import _byte_chars
    lead = {ch: b for b, ch in _byte_chars().items() if b >= 0xC0}
    return [f"<|byte_{lead[t]:02x}|>" if t in lead else t for t in tokens]


def _patch(base, llama) -> None:
    def set_vocab(self):
        tokens, toktypes, _ = self.get_vocab_base()
        tokens = ascii_lead_bytes(tokens)
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(toktypes)
        # llama.cpp refuses a gpt2 vocabulary without merges (an empty list is not written):
        # one whose result is no token changes no tokenization
        w.add_token_merges(["\u0120 \u0120"])
        special = base.gguf.SpecialVocab(self.dir_model, load_merges=False)
        special.add_to_gguf(w)
        w.add_add_bos_token(False)

    llama.LlamaModel.set_vocab = set_vocab
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    src, hf_dir, out = argv
    sys.path.insert(0, src)
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", "--outfile", out]
    from conversion import base, llama  # noqa: E402  (from the llama.cpp tree)
    _patch(base, llama)
    import convert_hf_to_gguf
    convert_hf_to_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
