"""Real-size GGUF files for the benchmarks: random weights in the shapes of the models people
run on a CPU, written by llama.cpp's own converter and `llama-quantize`, so that both systems
serve the very file a user would download (docs/design/benchmarks.md, "llama.cpp as a peer").

    python -m scripts.benchmarks._real_size SHAPE TYPE   # prints the file's path

SHAPE is one of SHAPES (the layer sizes of Llama-3.2-1B and -3B and Qwen2.5-1.5B, with
SmolLM2's 49,152-token tokenizer, as the issue's 1.07B model); TYPE a `llama-quantize` type
(Q4_0, Q4_K_M, ...) or F16. Files live in the cache (`$TL_CACHE_DIR/llamacpp/.../real-size`),
made once: the HF directory (float16 safetensors), its F16 GGUF, then each type from it.
Speed does not depend on the weights' values; they are drawn from a fixed seed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from scripts.benchmarks import _llamacpp_get as get

_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
          "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False,
          "tie_word_embeddings": True, "max_position_embeddings": 8192,
          "rope_theta": 500000.0}
_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 8192,
          "rope_theta": 1000000.0}
SHAPES = {
    "llama1b": dict(_LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "llama3b": dict(_LLAMA, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                    num_attention_heads=24, num_key_value_heads=8, head_dim=128),
    "qwen1.5b": dict(_QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2),
}
INIT_STD = 0.02


def home() -> Path:
    return get.home() / "real-size"


def holds(path: str | Path) -> bool:
    """Whether `path` is one of these files (random weights in a real model's shape)."""
    return Path(path).expanduser().resolve().is_relative_to(home().resolve())


def hf_dir(shape: str) -> Path:
    """The shape's HF checkpoint (float16, SmolLM2's tokenizer), written once."""
    from worker.presets import write_dir_atomically
    out = home() / shape
    if not (out / "config.json").is_file():
        write_dir_atomically(out, lambda tmp: _write_hf(shape, tmp), "config.json")
    return out


def _write_hf(shape: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from worker.registry_models import gguf_path
    src = gguf_path("smollm2")
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    cfg = dict(SHAPES[shape], vocab_size=len(tok), bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg, initializer_range=INIT_STD)
    get._say(f"writing {shape} ({out}) with random weights")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    gen = torch.Generator().manual_seed(0)
    for name, p in list(model.named_parameters()):
        value = (torch.randn(p.shape, generator=gen) * INIT_STD if p.dim() >= 2
                 else torch.ones(p.shape) if "norm" in name else torch.zeros(p.shape))
        owner, leaf = _owner(model, name)
        setattr(owner, leaf, torch.nn.Parameter(value.half(), requires_grad=False))
    model.tie_weights()
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _owner(model, name: str):
    parent, _, leaf = name.rpartition(".")
    return model.get_submodule(parent), leaf


def gguf_file(shape: str, qtype: str) -> Path:
    """The shape as a GGUF file of `qtype`, made once."""
    out = home() / f"{shape}.{qtype}.gguf"
    if out.is_file():
        return out
    if qtype == "F16":
        _convert(shape, out)
        return out
    f16 = gguf_file(shape, "F16")
    tool = get.ensure_tool("llama-quantize")
    tmp = out.with_suffix(".tmp")
    get._run([tool, f16, tmp, qtype], home() / "quantize.log", "llama-quantize")
    tmp.replace(out)
    return out


def _convert(shape: str, out: Path) -> None:
    get.ensure_tool("llama-quantize")   # fetches the tree the converter comes from
    src = get.home() / "src"
    get.ensure_gguf_package()
    _ensure_sentencepiece()
    tmp = out.with_suffix(".tmp")
    env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"), NO_LOCAL_GGUF="")
    get._run([sys.executable, "-c", _CONVERT, src / "convert_hf_to_gguf.py", hf_dir(shape),
              "--outtype", "f16", "--outfile", tmp], home() / "convert.log",
             "convert_hf_to_gguf", env=env)
    tmp.replace(out)


# The converter names the file's pre-tokenizer from the hash of its tokenizer's output, and
# loads that tokenizer with AutoTokenizer, which transformers picks by config.json's model
# type: for a qwen2 shape, Qwen2Tokenizer with its own pre-tokenizer (digits one by one), not
# SmolLM2's of tokenizer.json, a hash the converter does not know. Loading tokenizer.json as
# it is gives every shape SmolLM2's pre-tokenizer ("smollm"), as the llama shapes get anyway.
_CONVERT = """
import runpy, sys
import transformers
fast = transformers.PreTrainedTokenizerFast
transformers.AutoTokenizer.from_pretrained = lambda path, **kw: fast.from_pretrained(path, **kw)
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rpartition("/")[0])   # as `python convert_hf_to_gguf.py` has it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _ensure_sentencepiece() -> None:
    """The converter's llama path imports sentencepiece before it looks for a
    tokenizer.model (SmolLM2's tokenizer is BPE and has none): a benchmark dependency."""
    import importlib.util
    if importlib.util.find_spec("sentencepiece") is None:
        get._run([sys.executable, "-m", "pip", "install", "sentencepiece"],
                 home() / "convert.log", "pip install sentencepiece")


if __name__ == "__main__":
    home().mkdir(parents=True, exist_ok=True)
    print(gguf_file(sys.argv[1], sys.argv[2]))
