"""A checked GGUF file as a Hugging Face checkpoint directory, made once and cached by the
file's sha256: config, tokenizer (BOS/EOS, special tokens) and chat template from the file's
metadata, weights dequantized to float32 by transformers' GGUF reader. Everything after this
(the worker's load, the frontend's tokenizer, the gateway's chat template, replay) reads the
directory as it reads any checkpoint, so a GGUF model is served by the same code as the rest.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from worker.gguf_file import ARCHITECTURES, GgufFacts

FACTS = "gguf.json"   # the file's facts, written last: a directory without it is incomplete


def checkpoint_dir(facts: GgufFacts) -> Path:
    """The cached directory for this file, converted first if missing."""
    from worker.presets import cache_root, write_dir_atomically
    out = cache_root().parent / "gguf" / f"{Path(facts.path).stem}-{facts.sha256[:16]}"
    if not (out / FACTS).is_file():
        write_dir_atomically(out, lambda tmp: convert(facts, tmp), FACTS)
    return out


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
    if model.config.model_type != ARCHITECTURES[facts.architecture]:
        raise ValueError(f"{name}: GGUF architecture {facts.architecture!r} loaded as "
                         f"{model.config.model_type!r}")
    archs.check(model.config)
    # the weights are float32 now; only transformers' marker says "gguf", and it refuses
    # to save a model so marked
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / FACTS).write_text(json.dumps(facts.as_checkpoint(), indent=1))


def read_facts(checkpoint: Path) -> dict:
    """What a converted directory records of its GGUF file ({} for any other checkpoint)."""
    try:
        return json.loads((checkpoint / FACTS).read_text())
    except (OSError, ValueError):
        return {}
