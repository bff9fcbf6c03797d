"""GGUF files made from the registry model for tests: copies damaged on purpose, for the
refusal tests (one field patched in place, same length, so the rest of the file still
parses), a copy with some tensors stored as float, and transformers' own reading of a file.
"""
from __future__ import annotations

import copy
import functools
import struct
from pathlib import Path
from unittest import mock

import numpy as np

from worker.registry_models import gguf_path


def smollm2() -> Path:
    """The registry model's GGUF file (fetched once into the cache)."""
    return gguf_path("smollm2")


def patched(out: Path, old: bytes, new: bytes, after: bytes = b"") -> Path:
    """A copy of the smollm2 file with the first `old` found after `after` replaced."""
    data = bytearray(smollm2().read_bytes())
    at = data.index(old, data.index(after) if after else 0)
    data[at:at + len(old)] = new
    out.write_bytes(bytes(data))
    return out


def with_architecture(out: Path, arch: bytes) -> Path:
    """general.architecture = arch (5 bytes, as "llama" is)."""
    key = b"general.architecture"
    return patched(out, b"llama", arch, after=key)


def with_tensor_type(out: Path, name: bytes, ggml_type: int) -> Path:
    """The tensor `name` (1-D) declared as ggml_type: its info is the name, n_dims (u32),
    the dims (u64 each), then the type (u32)."""
    data = smollm2().read_bytes()
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    old = data[type_at:type_at + 4]
    return patched(out, data[at:type_at] + old, data[at:type_at] + struct.pack("<I", ggml_type),
                   after=name)


def truncated(out: Path, keep: int) -> Path:
    out.write_bytes(smollm2().read_bytes()[:keep])
    return out


def with_scalar(out: Path, key: str, value: int) -> Path:
    """The u32 metadata field `key` (e.g. llama.block_count) set to `value`: its entry is
    the key, its type (u32) and the value."""
    data = smollm2().read_bytes()
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    if struct.unpack_from("<I", data, at)[0] != 4:
        raise ValueError(f"{key} is not a u32 field")
    old = data[at:at + 8]
    return patched(out, old, old[:4] + struct.pack("<I", value), after=name)


def with_float_tensors(out: Path, names: set[str], dtype=np.float16) -> Path:
    """A copy of the smollm2 file, written anew, with the tensors `names` stored as float
    (`dtype`: F16 or F32) in its own row order; everything else as it was."""
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(smollm2())
    writer = gguf.GGUFWriter(out, arch="llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        data = t.data
        if t.name in names:
            data = dequantize(t.data, t.tensor_type).astype(dtype)
            kind = gguf.GGMLQuantizationType.F16 if dtype == np.float16 else \
                gguf.GGMLQuantizationType.F32
        else:
            kind = t.tensor_type
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, kind)
        tensors.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return out


def transformers_model(path: Path):
    """transformers' own reading of a GGUF file: every tensor dequantized to float32.

    transformers asks gguf-py for the same tensor-name map once per tensor (397 times for
    smollm2, ~4 s of the 12 s load on 2 cores); the map is a pure function of the
    architecture and the layer count, so it is memoized for the load (the weights are the
    same bits). It also parses the file's metadata twice (config, then weights: ~3.7 s each
    for the 49,152-token tokenizer's strings), so the parsed file is kept for the second."""
    import gguf
    from transformers import AutoModelForCausalLM
    memoized = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    reader = functools.lru_cache(maxsize=None)(gguf.GGUFReader)   # read-only use
    with mock.patch.object(gguf, "get_tensor_name_map", memoized), \
            mock.patch.object(gguf, "GGUFReader", reader):
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                    attn_implementation="sdpa").eval()


def registry_model():
    """transformers_model of the registry file, a copy of its own for each caller (some swap
    layers in place): the file is read once a session (~5 s), a copy takes ~0.3 s."""
    return copy.deepcopy(_registry_model())


@functools.cache
def _registry_model():
    return transformers_model(smollm2())


@functools.cache
def registry_tokenizer():
    """transformers' own reading of the registry file's tokenizer and chat template, once a
    session (~3 s on 2 cores: gguf-py parses its 49,152 tokens and merges). Read-only use:
    the modules that compare with it and the files made from the registry file (their
    tokenizer fields are its fields, copied) share it."""
    from transformers import AutoTokenizer
    path = smollm2()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def small_vocabulary(size: int) -> tuple[list[str], list[str]]:
    """A byte-level BPE tokenizer of `size` tokens, (tokens, merges): the 256 bytes as GPT-2
    spells them, then pairs of letters, each with its merge (a file whose tokenizer only the
    loaders read: the registry model's 49,152 tokens and merges took gguf-py ~3.7 s to parse,
    each time a file was written and read)."""
    from worker.preset_tokenizer import _byte_chars
    chars = _byte_chars()
    letters = [chars[b] for b in range(ord("a"), ord("z") + 1)]
    pairs = [(x, y) for x in letters for y in letters][:max(0, size - 256)]
    if 256 + len(pairs) != size:   # a file whose vocabulary is not its model's would mislead
        raise ValueError(f"small_vocabulary makes 256 to {256 + 26 * 26} tokens, not {size}")
    return [chars[b] for b in range(256)] + [x + y for x, y in pairs], \
        [f"{x} {y}" for x, y in pairs]


def written(out: Path, model, architecture: str) -> Path:
    """A GGUF file of a small transformers `model` of a layout the converter does not
    permute (qwen2, qwen3): its linear weights and embeddings as Q8_0 blocks, the rest F32,
    named as llama.cpp names them; a tokenizer of the model's vocabulary size
    (small_vocabulary)."""
    import gguf
    from gguf.quants import quantize

    from worker.gguf_names import LAYER_LINEARS, LAYER_OTHERS, TOP, parameter_name
    cfg, state = model.config, model.state_dict()
    writer = gguf.GGUFWriter(out, arch=architecture)
    for key, value in {"block_count": cfg.num_hidden_layers, "context_length": 1024,
                       "embedding_length": cfg.hidden_size,
                       "feed_forward_length": cfg.intermediate_size,
                       "attention.head_count": cfg.num_attention_heads,
                       "attention.head_count_kv": cfg.num_key_value_heads,
                       "attention.key_length": cfg.head_dim,
                       "attention.value_length": cfg.head_dim}.items():
        writer.add_uint32(f"{architecture}.{key}", value)
    writer.add_float32(f"{architecture}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    writer.add_float32(f"{architecture}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    tokens, merges = small_vocabulary(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    names = [*TOP, *(f"blk.{i}.{n}" for i in range(cfg.num_hidden_layers)
                     for n in (*(f"{k}.weight" for k in LAYER_LINEARS), *LAYER_OTHERS))]
    for name in names:
        hf = parameter_name(name)
        if hf not in state:
            continue
        data = state[hf].float().numpy()
        if data.ndim == 2:
            writer.add_tensor(name, quantize(data, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
