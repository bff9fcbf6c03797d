"""A checked GGUF file's weights dequantized to float32 by transformers' GGUF reader, saved
as a Hugging Face checkpoint, made once and cached by the file's sha256. Only the float path
reads it (`--dequantize`, `--dtype bfloat16`, cuda, `--tp` > 1, or an architecture whose
blocks worker/gguf_quant.py does not read): a file served on its blocks needs no such copy
(worker/gguf_dir.py, worker/gguf_tensors.py). On a 1B Q4_K_M file it is ~1 min and 4 GB.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from worker.gguf_dir import cached_dir, check_model_type, write_facts
from worker.gguf_file import GgufFacts


def float_dir(facts: GgufFacts) -> Path:
    """The cached float32 checkpoint for this file, converted first if missing."""
    return cached_dir(facts, "gguf", convert)


def convert(facts: GgufFacts, out: Path) -> None:
    """Write the HF checkpoint of the GGUF file `facts` describes into `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker import archs
    print(f"converting {facts.path} to a float32 checkpoint in {out} (once)",
          file=sys.stderr, flush=True)
    src, name = str(Path(facts.path).parent), Path(facts.path).name
    try:
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    except Exception as e:   # transformers' reader: one line, whatever it raised
        raise ValueError(f"{name}: transformers cannot load this GGUF file "
                         f"({type(e).__name__}: {e})") from None
    check_model_type(name, facts.architecture, model.config.model_type)
    archs.check(model.config)
    # the weights are float32 now; only transformers' marker says "gguf", and it refuses
    # to save a model so marked
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_facts(facts, out)
