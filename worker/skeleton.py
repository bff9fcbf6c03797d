"""A checkpoint's model built around layers put in before any weight is read: the modules
are made with their parameters on the meta device (no memory), `swap` puts its layers in
(a quantized GGUF file's QuantLinear/QuantEmbedding on their blocks, worker/gguf_quant.py),
and only the tensors still empty are read: by `read` (a GGUF file's float tensors by their
GGUF names, worker/gguf_tensors.py), or from the checkpoint's safetensors. So the float
weights of the swapped layers are never made, read or mapped.

What transformers' from_pretrained would give, tensor for tensor: the buffers that no file
holds (the rotary frequencies) are computed on the CPU by the modules' own code, as
from_pretrained's initialization computes them; the loaded tensors take the model's dtype;
parameters the model shares (a tied output head) stay one tensor; the generation config is
the checkpoint's (tests/worker/test_skeleton.py compares both, buffers included).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

INDEX = "model.safetensors.index.json"
T = TypeVar("T")
# (model, {name: its empty tensor}) -> {name: the tensor read}
Reader = Callable[[nn.Module, dict], dict]


def build(path: Path, config, attn_implementation: str, swap: Callable[[nn.Module], T],
          read: Reader | None = None) -> tuple[nn.Module, T]:
    """The float32 model of the checkpoint at `path` (its `config` read and checked), in
    eval mode on the CPU, and what `swap(model)` returned, run on the empty model before
    anything is loaded; the tensors still empty are read by `read`, or from the
    safetensors files at `path` (None). ValueError where a tensor the model needs is in no
    file."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    model.tie_weights()   # made again outside: the context's parameters are each new
    shared = _shared(model)
    swapped = swap(model)
    _load(model, read or (lambda m, wanted: _read_safetensors(path, wanted)))
    _reshare(model, shared)
    if empty := [n for n, t in _tensors(model) if t.is_meta]:
        raise ValueError(f"{path}: no tensor for {', '.join(empty[:3])} in its files "
                         f"({len(empty)} missing)")
    _generation_config(model, path)
    return model.eval(), swapped


def _tensors(model: nn.Module):
    """(name, tensor) of every parameter and buffer, each name of a shared one."""
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _shared(model: nn.Module) -> list[list[str]]:
    """The groups of parameter names that are one tensor (a tied head and embedding)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _load(model: nn.Module, read: Reader) -> None:
    """What `read` finds for the model's empty parameters and its buffers, put into it in
    the model's dtype (assigned: no second copy is made)."""
    wanted = {name: t for name, t in model.named_parameters(remove_duplicate=False)
              if t.is_meta}
    wanted.update(model.named_buffers(remove_duplicate=False))
    loaded = {name: t.to(wanted[name].dtype) for name, t in read(model, wanted).items()}
    model.load_state_dict(loaded, strict=False, assign=True)


def _read_safetensors(path: Path, wanted: dict) -> dict:
    from safetensors import safe_open

    loaded = {}
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in wanted:
                    loaded[name] = f.get_tensor(name)
    return loaded


def _reshare(model: nn.Module, shared: list[list[str]]) -> None:
    """Each group of shared parameters that is still a parameter everywhere becomes one
    tensor again: the one loaded (assigning a loaded tensor replaced one name's only)."""
    for names in shared:
        owners = [_owner(model, n) for n in names]
        if not all(isinstance(getattr(m, leaf, None), nn.Parameter) for m, leaf in owners):
            continue   # swapped out (a quantized head and embedding share their blocks)
        loaded = [getattr(m, leaf) for m, leaf in owners if not getattr(m, leaf).is_meta]
        if loaded:
            for m, leaf in owners:
                setattr(m, leaf, loaded[0])


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent, _, leaf = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), leaf


def _safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    return [path / "model.safetensors"]


def _generation_config(model: nn.Module, path: Path) -> None:
    """The checkpoint's generation_config.json, as from_pretrained reads it (absent: the
    one made of the model config, as there)."""
    from transformers import GenerationConfig
    try:
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        pass
