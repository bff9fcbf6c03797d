"""Model resolution and runner construction. Nothing is downloaded from a model hub: a
model is a preset, a registry model (worker/registry_models.py), a GGUF file or a local HF
directory."""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from core.ipc.protocol import ModelInfo
from worker import gguf_file, registry_models
from worker.presets import PRESETS, preset_dir
from worker.registry_models import REGISTRY

DTYPES = ("float32", "bfloat16")


def resolve_model(name: str) -> Path:
    """The checkpoint directory `name` is served from (resolve_checkpoint without the facts)."""
    return resolve_checkpoint(name)[0]


def resolve_checkpoint(name: str) -> tuple[Path, dict]:
    """A model name -> (its HF checkpoint directory, what ModelInfo.checkpoint records).
    Presets are written once; a registry model is fetched once and served as its GGUF
    file; a GGUF file is checked and its config and tokenizer cached once: its directory
    holds no weights (worker/gguf_dir.py; float_checkpoint makes them where needed)."""
    if name in PRESETS:
        return preset_dir(name), {"format": "preset", "name": name}
    if name in REGISTRY:
        return _gguf_checkpoint(registry_models.gguf_path(name), REGISTRY[name].sha256)
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        return _gguf_checkpoint(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{name!r} is not a preset ({', '.join([*PRESETS, *REGISTRY])}), "
                                "a .gguf file nor a local checkpoint directory with a config.json")
    return path, {"format": "hf", "path": str(path.resolve())}


def model_problem(name: str) -> str | None:
    """One line saying why `name` cannot be served, or None; fetches and converts what it
    needs first, so the processes that load it next find it cached ("null" needs nothing)."""
    if name == "null":
        return None
    try:
        resolve_checkpoint(name)
    except (OSError, ValueError, registry_models.RegistryUnavailable) as e:
        return str(e)
    return None


def _gguf_checkpoint(path: Path, pinned: str | None = None) -> tuple[Path, dict]:
    from worker.gguf_dir import metadata_dir
    facts = gguf_file.inspect(path, pinned=pinned is not None)
    if pinned is not None and facts.sha256 != pinned:
        raise ValueError(f"{path}: sha256 {facts.sha256} does not match the pinned "
                         f"{pinned}: delete it to fetch it again")
    return metadata_dir(facts), facts.as_checkpoint()


def float_checkpoint(path: Path, checkpoint: dict) -> Path:
    """A directory with the float weights of the checkpoint resolve_checkpoint gave: `path`
    itself, or for a GGUF file its float32 conversion (made once: worker/gguf_convert.py)."""
    if checkpoint["format"] != "gguf":
        return path
    from worker.gguf_convert import float_dir
    from worker.gguf_dir import facts_of
    return float_dir(facts_of(checkpoint))


def make_runner(model: str, *, device: str = "cpu", dtype: str = "float32",
                num_blocks: int | None = None, kv_memory: int | None = None,
                block_size: int = 16, max_model_len: int | None = None, tp: int = 1,
                batch_invariant: bool | None = False, quantize: str | None = None,
                dequantize: bool = False, draft: str | None = None,
                prefill_bf16: bool = False, int8_activations: bool = False):
    """A ModelRunner for a preset or local checkpoint, or the NullRunner for "null".
    The KV pool holds num_blocks blocks, or what kv_memory bytes hold, or a default.
    tp > 1: this process's shard of the model (worker/tp.py has set up the process group);
    kv_memory is then per rank. `batch_invariant`: docs/design/cpu-paths.md, "Batch-invariant mode"
    (ValueError where it cannot run; None: on where it can, off elsewhere). `quantize`,
    `dequantize`: which weights stay quantized (worker/quantized.py). `draft`: a draft model
    for speculative decoding (worker/draft.py), loaded as `model` is, with a pool like its.
    `prefill_bf16`: quantized layers multiply wide eager calls in bfloat16 (worker/quantized.py,
    wide_bf16). `int8_activations`: they round their input to int8 (quantized.int8_activations)."""
    if model == "null":
        if prefill_bf16 or int8_activations:
            raise ValueError(f"--{'prefill-bf16' if prefill_bf16 else 'int8-activations'} "
                             "needs quantized weights: the null model has none")
        if batch_invariant:   # None (where it can) is off here
            raise ValueError("--batch-invariant needs a model: the null model has no logits")
        from worker.null import NullRunner
        return NullRunner(num_blocks=num_blocks or 256, block_size=block_size,
                          max_model_len=max_model_len or 2048,
                          tokenizer=str(preset_dir("tiny")))
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}")
    import torch

    from worker import kv
    from worker.digest import weights_digest
    from worker import quantized
    from worker.malloc import keep_heap, trim
    from worker.runner import ModelRunner

    keep_heap()

    from worker.bf16 import fallback_note
    if note := fallback_note(device, dtype):
        print(note, file=sys.stderr, flush=True)
    from worker import prebuild
    kernels_built = prebuild.start(device)   # beside the metadata's read
    path, checkpoint = resolve_checkpoint(model)
    kernels_built()
    mode = quantized.mode(checkpoint, quantize, dequantize, device, dtype, tp)
    tensors = None
    if mode == "gguf":
        from worker.gguf_tensors import GgufTensors
        tensors = GgufTensors(checkpoint["path"])
    if prefill_bf16:
        quantized.check_prefill_bf16(mode, batch_invariant)
        batch_invariant = False
    if int8_activations:
        quantized.check_int8(mode)
    hf, layers = load_weights(path, checkpoint, mode, device, dtype, tp, tensors)
    quantization = {"mode": mode, "layers": layers}
    if prefill_bf16:
        quantization["prefill"] = quantized.wide_bf16(hf)
    if int8_activations:
        quantization["activations"] = quantized.int8_activations(hf)
    cfg, torch_dtype = hf.config, getattr(torch, dtype)
    limit = context_limit(cfg, max_model_len)
    shape = kv.kv_shape(cfg, tp)
    blocks = kv.size_pool(shape, block_size, torch_dtype, limit, num_blocks, kv_memory)
    cache = kv.allocate(shape, blocks, block_size, torch_dtype, hf.device)
    if batch_invariant is None:
        from worker.invariant import supported
        batch_invariant = supported(hf, cache, tp)
    if checkpoint["format"] == "gguf" and model not in REGISTRY:
        model = checkpoint["path"]   # absolute: replay finds the file from anywhere
    info = ModelInfo(model=model, num_blocks=blocks, block_size=block_size, max_model_len=limit,
                     vocab_size=cfg.vocab_size, eos_ids=_eos_ids(hf), dtype=dtype,
                     device=str(hf.device), tokenizer=str(path), tp=tp,
                     batch_invariant=batch_invariant, checkpoint=checkpoint,
                     weights=weights_digest(hf), quantization=quantization,
                     hidden_size=int(cfg.hidden_size))
    runner = ModelRunner(hf, cache, info)
    runner.probe()
    if draft is not None:
        _attach_draft(runner, draft, device, dtype)
    gc.collect()
    trim()   # what the load freed goes back; the steps' heap is kept from here (malloc.py)
    if tensors is not None:   # the file's pages the load read but nothing serves from
        tensors.release_unused(hf)
    return runner


def _attach_draft(runner, draft: str, device: str, dtype: str) -> None:
    """The draft model's runner, its pool the target's geometry (worker/draft.py)."""
    from dataclasses import replace

    from worker.draft import Drafter
    info = runner.info
    if info.tp != 1:
        raise ValueError("a draft model runs with --tp 1")
    d = make_runner(draft, device=device, dtype=dtype, num_blocks=info.num_blocks,
                    block_size=info.block_size, max_model_len=info.max_model_len,
                    batch_invariant=info.batch_invariant)
    if d.info.vocab_size != info.vocab_size:
        raise ValueError(f"the draft model {draft!r} has {d.info.vocab_size} tokens in its "
                         f"vocabulary, the model {info.vocab_size}: they must be the same")
    runner.drafter = Drafter(d)
    runner.info = replace(info, draft=d.info.model)


def load_weights(path: Path, checkpoint: dict, mode: str, device: str, dtype: str, tp: int,
                 tensors=None):
    """(the model, {module name: quantized type}) as `mode` says (worker/quantized.py). A
    GGUF file served as "gguf" is read in place from `tensors` (its GgufTensors): the model
    built around its blocks (worker/skeleton.py), its float tensors read by their GGUF names;
    the float weights the blocks stand for are never made."""
    if mode != "gguf":
        from worker.quantized import quantize_float
        hf = load_model(float_checkpoint(path, checkpoint), device, dtype, tp)
        return hf, quantize_float(hf, mode)
    from worker import attention, skeleton
    from worker.gguf_quant import load_quantized
    arch = checkpoint["architecture"]
    return skeleton.build(path, model_config(path), attention.NAME,
                          lambda m: load_quantized(m, tensors, arch),
                          lambda m, wanted: tensors.read_parameters(m, wanted, arch))


def model_config(path: Path, tp: int = 1):
    """The checkpoint's config, checked: ValueError for an architecture or config feature
    the paged attention does not serve exactly (worker/archs.py), or a model that cannot be
    split over `tp` ranks. The paged attention is registered."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    from worker import archs, attention
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    archs.check(config)
    archs.check_split(config, tp)
    attention.register()
    return config


def load_model(path: Path, device: str = "cpu", dtype: str = "float32", tp: int = 1):
    """The checkpoint as a transformers model whose attention is the paged one; ValueError
    as model_config says."""
    import torch
    from transformers import AutoModelForCausalLM

    from worker import attention

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch sees no CUDA device")
    config = model_config(path, tp)
    split = {}
    if tp > 1:  # transformers places each shard on this rank's device
        from transformers import DistributedConfig
        split = {"distributed_config": DistributedConfig(tp_size=tp)}
    hf = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=getattr(torch, dtype),
                                              local_files_only=True,
                                              attn_implementation=attention.NAME, **split)
    return (hf if split else hf.to(dev)).eval()


def context_limit(cfg, requested: int | None) -> int:
    """At most the model's positions (a sliding window does not cap it: the paged attention
    attends within the window)."""
    limit = cfg.max_position_embeddings
    if requested is not None:
        if requested > limit:
            raise ValueError(f"max_model_len {requested} exceeds the model's limit {limit}")
        limit = requested
    return limit


def _eos_ids(hf) -> list[int]:
    for src in (hf.generation_config, hf.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            return sorted({eos} if isinstance(eos, int) else set(eos))
    return []
