"""A worker's settings against its model, checked before anything loads: by scripts/serve
before it starts a process, and by the worker itself before it loads weights, so that a
setting the model cannot take is one line and exit 2, never a traceback from inside loading.
The model's config is read (not its weights); the checks are the loader's own."""
from __future__ import annotations

import sys
from pathlib import Path

from core.config import layout_problem


def problem(model: str, *, tp: int = 1, dtype: str = "float32", block_size: int = 16,
            num_blocks: int | None = None, kv_memory: int | None = None,
            max_model_len: int | None = None, read_config: bool = True,
            quantize: str | None = None, dequantize: bool = False,
            device: str = "cpu") -> str | None:
    """Why a worker cannot start so, or None. With read_config=False only the checks that
    need no model config (the KV layout's bounds, the null model's, --quantize's)."""
    why = layout_problem(1 if num_blocks is None else num_blocks, block_size,
                         1 if max_model_len is None else max_model_len)
    if why:
        return why
    if kv_memory is not None and kv_memory < 1:
        return f"kv_memory must be at least 1 byte, got {kv_memory}"
    if model == "null":
        if quantize or dequantize:
            return "the null model has no weights to quantize or dequantize"
        return "the null model has no weights to split: use --tp 1" if tp != 1 else None
    if quantize is not None and (why := _weights_problem(model, quantize, dequantize,
                                                         device, dtype, tp)):
        return why
    if not read_config:
        return None
    from worker.registry_models import RegistryUnavailable
    try:
        _check_config(model, tp, dtype, block_size, num_blocks, kv_memory, max_model_len)
    except (ValueError, OSError, RegistryUnavailable) as e:
        return str(e)
    return None


def draft_problem(draft: str, tp: int) -> str | None:
    """Why `draft` cannot be a draft model (worker/draft.py), or None; its vocabulary is
    checked against the model's when both load."""
    from worker.load import model_problem
    if tp != 1:
        return "a draft model runs with --tp 1"
    if draft == "null":
        return "the null model cannot draft: it has no logits"
    return model_problem(draft)


def _weights_problem(model, quantize, dequantize, device, dtype, tp) -> str | None:
    from worker.load import resolve_checkpoint
    from worker.quantized import refusal
    from worker.registry_models import RegistryUnavailable
    try:
        checkpoint = resolve_checkpoint(model)[1]
    except (ValueError, OSError, RegistryUnavailable) as e:
        return str(e)
    return refusal(checkpoint, quantize, dequantize, device, dtype, tp)


def _check_config(model, tp, dtype, block_size, num_blocks, kv_memory, max_model_len) -> None:
    import torch
    from transformers import AutoConfig

    from worker import archs, kv
    from worker.load import DTYPES, context_limit, resolve_model
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}")
    config = AutoConfig.from_pretrained(resolve_model(model), local_files_only=True)
    archs.check(config)
    archs.check_split(config, tp)
    limit = context_limit(config, max_model_len)
    kv.size_pool(kv.kv_shape(config, tp), block_size, getattr(torch, dtype), limit, num_blocks,
                 kv_memory, weights=_weight_file_bytes(model) // tp)


def _weight_file_bytes(model: str) -> int:
    """The bytes of a local model's weight files (a .gguf, or a directory's safetensors): a
    lower bound on the weights the worker will hold, so that the check before loading
    refuses only a pool that cannot fit beside them (the worker checks again once they are
    loaded). 0 for the presets and registry models, which are small."""
    path = Path(model)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return 0


# What loading a model raises for a setting or a machine that cannot take it (a pool too
# large to allocate is a RuntimeError from torch); the worker says it in one line.
LOAD_ERRORS = (ValueError, OSError, MemoryError, RuntimeError)


def refuse(why: str) -> int:
    """One line on stderr; the worker's exit status for settings it cannot start with."""
    first = (why.splitlines() or ["?"])[0]   # torch's errors carry a C++ backtrace after it
    print(f"[worker] cannot start: {first}", file=sys.stderr, flush=True)
    return 2
