"""A checked GGUF file's checkpoint directory without weights, made once and cached by the
file's sha256: config.json, generation_config.json, the tokenizer (BOS/EOS, special tokens)
and chat template, all from the file's metadata by transformers' GGUF reader, which reads no
tensor for them. The frontend's tokenizer, the gateway's chat template, replay and the
worker's config read the directory as they read any checkpoint's; the worker reads the
weights from the GGUF file itself (worker/gguf_tensors.py). A float copy of the weights is
made only where the float path needs one (worker/gguf_convert.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from worker.gguf_file import ARCHITECTURES, GgufFacts

FACTS = "gguf.json"   # the file's facts, written last: a directory without it is incomplete


def metadata_dir(facts: GgufFacts) -> Path:
    """The cached directory for this file, written first if missing."""
    return cached_dir(facts, "gguf-meta", write_metadata)


def cached_dir(facts: GgufFacts, kind: str, write) -> Path:
    """cache/`kind`/<stem>-<sha256 prefix>, made by `write(facts, tmp)` if missing."""
    from worker.presets import cache_root, write_dir_atomically
    out = cache_root().parent / kind / f"{Path(facts.path).stem}-{facts.sha256[:16]}"
    if not (out / FACTS).is_file():
        write_dir_atomically(out, lambda tmp: write(facts, tmp), FACTS)
    return out


def write_metadata(facts: GgufFacts, out: Path) -> None:
    """Write the config, generation config and tokenizer of the file `facts` describes into
    `out`, then its facts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from worker import archs
    src, name = str(Path(facts.path).parent), Path(facts.path).name
    try:
        config = AutoConfig.from_pretrained(src, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    except Exception as e:   # transformers' reader: one line, whatever it raised
        raise ValueError(f"{name}: transformers cannot read this GGUF file's metadata "
                         f"({type(e).__name__}: {e})") from None
    check_model_type(name, facts.architecture, config.model_type)
    archs.check(config)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_facts(facts, out)


def check_model_type(name: str, architecture: str, model_type: str) -> None:
    if model_type != ARCHITECTURES[architecture]:
        raise ValueError(f"{name}: GGUF architecture {architecture!r} loaded as "
                         f"{model_type!r}")


def write_facts(facts: GgufFacts, out: Path) -> None:
    (out / FACTS).write_text(json.dumps(facts.as_checkpoint(), indent=1))


def facts_of(checkpoint: dict) -> GgufFacts:
    """The GgufFacts a ModelInfo.checkpoint record of a GGUF file was made of."""
    return GgufFacts(checkpoint["path"], checkpoint["sha256"], checkpoint["architecture"],
                     checkpoint["tensor_types"])
