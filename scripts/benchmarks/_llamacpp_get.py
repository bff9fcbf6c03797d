"""Find or build llama.cpp's tools (`llama-server`, `llama-perplexity`) and the GGUF f32 copy
of a model, cached.

Everything lives under the cache directory ($TL_CACHE_DIR, else ~/.cache/tl-engine) in
llamacpp/<LLAMA_CPP_PYTHON>/: src/ (llama.cpp as vendored in the llama-cpp-python source
distribution), build/ (cmake, Release, CPU only, only the targets asked for), gguf/
(converted models) and build.log. A first use of a tool builds it, later ones find it; a
lock file keeps two benchmark runs from building at once (docs/design/benchmarks.md, "llama.cpp as a
peer").
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from worker.presets import PRESETS, cache_root

LLAMA_CPP_PYTHON = "0.3.36"   # its sdist carries llama.cpp under vendor/llama.cpp
GGUF = "0.19.0"   # the registry's gguf: reads GGUF here and brings the converter's deps
# -march=native turns on ggml's AMX matmul where the CPU has AMX, but a virtual machine may
# not let a process use the tiles (its first ldtilecfg is a general protection fault: what
# llama-server died of on a Xeon here). The engine has no AMX path either: both sides run
# the AVX-512 (or AVX2) code.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CUDA=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", f"-DCMAKE_C_FLAGS={NO_AMX}",
               f"-DCMAKE_CXX_FLAGS={NO_AMX}"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def home() -> Path:
    return cache_root().parent / "llamacpp" / LLAMA_CPP_PYTHON


def tool_path(target: str) -> Path:
    return home() / "build" / "bin" / target


def server_path() -> Path:
    return tool_path("llama-server")


def found(target: str = "llama-server") -> Path | None:
    """The built tool (llama-server by default), or None (no build is attempted, or the
    build was made with other flags)."""
    p = tool_path(target)
    stamp = _flags_stamp(home() / "build")
    current = stamp.is_file() and stamp.read_text() == "\n".join(CMAKE_FLAGS)
    return p if current and p.is_file() and os.access(p, os.X_OK) else None


@contextmanager
def _locked(name: str):
    home().mkdir(parents=True, exist_ok=True)
    with open(home() / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list, log: Path, what: str, cwd: Path | None = None, env=None) -> None:
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        raise RuntimeError(f"{what} failed (exit {rc}); the end of {log}:\n{tail}")


def _fetch_source(log: Path) -> None:
    """llama.cpp's tree from the llama-cpp-python sdist (pip, no binary) into src/."""
    with tempfile.TemporaryDirectory(dir=home()) as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
              f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp], log, "pip download")
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tree = Path(tmp) / sdist.name[:-len(".tar.gz")] / "vendor" / "llama.cpp"
        if not (tree / "tools" / "server").is_dir():
            raise RuntimeError(f"{sdist.name} carries no vendor/llama.cpp/tools/server")
        os.rename(tree, home() / "src")


def _flags_stamp(build: Path) -> Path:
    return build / ".tl-cmake-flags"


def _fresh_build_dir(build: Path) -> None:
    """A build/ configured with other flags (an older harness's) is made again from
    nothing: its tools would not be the ones these flags give."""
    want = "\n".join(CMAKE_FLAGS)
    stamp = _flags_stamp(build)
    if build.exists() and (not stamp.is_file() or stamp.read_text() != want):
        shutil.rmtree(build)
    build.mkdir(parents=True, exist_ok=True)
    stamp.write_text(want)


def ensure_server() -> Path:
    """The llama-server binary, built on first use (minutes: a progress line says so)."""
    return ensure_tool("llama-server")


def ensure_tool(target: str) -> Path:
    """A llama.cpp tool (`llama-server`, `llama-perplexity`) of the cached tree, its cmake
    target built on first use into the one build/ (the library is compiled once for all)."""
    if (p := found(target)) is not None:
        return p
    with _locked("build"):
        if (p := found(target)) is not None:   # built by another run while this one waited
            return p
        log = home() / "build.log"
        jobs = str(os.cpu_count() or 2)
        _say(f"llama.cpp: building {target} {LLAMA_CPP_PYTHON} once, into {home()} "
             f"(-j{jobs}, many minutes on few cores; log: {log})")
        t0 = time.monotonic()
        if not (home() / "src" / "CMakeLists.txt").is_file():
            shutil.rmtree(home() / "src", ignore_errors=True)
            _fetch_source(log)
        src, build = home() / "src", home() / "build"
        _fresh_build_dir(build)
        _run(["cmake", "-S", src, "-B", build, *CMAKE_FLAGS], log, "cmake configure")
        _run(["cmake", "--build", build, "--config", "Release", "--target", target,
              f"-j{jobs}"], log, "cmake build")
        if (p := found(target)) is None:
            raise RuntimeError(f"the build finished but {tool_path(target)} is missing: "
                               f"see {log}")
        _say(f"llama.cpp: built {p} in {time.monotonic() - t0:.0f}s")
        return p


def ensure_gguf_package() -> None:
    """`gguf` from the registry, a benchmark dependency installed on first use: check_model
    reads with it, and it brings what the tree's own gguf-py needs (numpy, tqdm, pyyaml,
    requests). The converter itself imports the tree's gguf-py: the registry's 0.19.0
    predates it (no LazyChunkedTensor)."""
    if importlib.util.find_spec("gguf") is not None:
        return
    _say(f"llama.cpp: installing gguf=={GGUF} (a benchmark dependency) into {sys.prefix}")
    _run([sys.executable, "-m", "pip", "install", f"gguf=={GGUF}"], home() / "build.log",
         "pip install gguf")


def _model_key(model: str, path: Path) -> str:
    if model in PRESETS:
        return f"{model}-{PRESETS[model].version}"
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    return f"{path.name}-{digest}"


def _stale(out: Path, hf_dir: Path) -> bool:
    if not out.is_file():
        return True
    newest = max(f.stat().st_mtime for f in hf_dir.iterdir() if f.is_file())
    return newest > out.stat().st_mtime


def ensure_model(model: str, hf_dir: Path) -> Path:
    """The checkpoint at `hf_dir` as GGUF f32, converted on first use (and when it changed)."""
    out = home() / "gguf" / f"{_model_key(model, hf_dir)}.f32.gguf"
    if not _stale(out, hf_dir):
        return out
    with _locked("convert"):
        if not _stale(out, hf_dir):
            return out
        if not (home() / "src" / "convert_hf_to_gguf.py").is_file():
            ensure_server()  # fetches the tree the converter comes from
        ensure_gguf_package()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        _say(f"llama.cpp: converting {hf_dir} to {out} (f32)")
        from scripts import ROOT
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path)
        _run([sys.executable, "-m", "scripts.benchmarks._llamacpp_convert", home() / "src",
              hf_dir, tmp], home() / "convert.log", "GGUF conversion", env=env)
        os.replace(tmp, out)
    return out


# Texts llama.cpp takes for end-of-generation tokens (the common ones of its list): with
# ignore_eos it bans them, where the engine only keeps going past EOS.
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<end_of_turn>",
             "<|end_of_text|>", "<|eom_id|>", "<eos>")


def check_model(gguf_path: Path, hf_dir: Path, same_file: bool = False) -> dict:
    """The GGUF's vocabulary and specials against the checkpoint's config, and tensors the
    converter copies as they are against the checkpoint's, bit for bit: the same ids must
    mean the same rows. ValueError on a mismatch; the facts otherwise, with the ids
    llama.cpp treats as end of generation (`eog_ids`). `same_file`: the engine serves this
    very file (`--gguf`), so its tensors are neither F32 nor compared."""
    ensure_gguf_package()   # a GGUF cached by another checkout's run: this .venv may lack it
    from gguf import GGUFReader
    cfg = json.loads((hf_dir / "config.json").read_text())
    r = GGUFReader(str(gguf_path))

    def scalar(key):
        f = r.fields.get(key)
        return None if f is None else f.parts[f.data[0]].tolist()[0]

    texts = r.fields["tokenizer.ggml.tokens"]
    n_vocab = len(texts.data)
    eog = {i for i, d in enumerate(texts.data) if bytes(texts.parts[d]).decode() in EOG_TEXTS}
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    facts = {"vocab": n_vocab, "embedding_rows": int(embd.shape[-1]),
             "eos": scalar("tokenizer.ggml.eos_token_id"),
             "add_bos": scalar("tokenizer.ggml.add_bos_token"),
             "tensor_types": sorted({t.tensor_type.name for t in r.tensors})}
    facts["eog_ids"] = sorted(eog | ({facts["eos"]} if facts["eos"] is not None else set()))
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    problems = [f"{k} {facts[k]} != {want}" for k, want in
                (("vocab", cfg["vocab_size"]), ("embedding_rows", cfg["vocab_size"]),
                 ("eos", eos)) if want is not None and facts[k] != want]
    if not same_file and facts["tensor_types"] != ["F32"]:
        problems.append(f"tensor types {facts['tensor_types']} (want F32 only)")
    if not same_file:
        problems += _weights_differ(r, hf_dir)
    if problems:
        raise ValueError(f"{gguf_path} does not match {hf_dir}: {'; '.join(problems)}")
    return facts


# Tensors the converter copies as they are (Q and K it permutes), bit for bit.
SAME_BITS = {"token_embd.weight": "model.embed_tokens.weight",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
             "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight"}


def _weights_differ(reader, hf_dir: Path) -> list[str]:
    import numpy as np
    from safetensors import safe_open
    files = sorted(hf_dir.glob("*.safetensors"))
    ours = {t.name: t for t in reader.tensors}
    out = []
    for g_name, hf_name in SAME_BITS.items():
        f = next((f for f in files if hf_name in safe_open(f, "np").keys()), None)
        if f is None or g_name not in ours:
            out.append(f"{g_name} / {hf_name} missing")
            continue
        want = safe_open(f, "np").get_tensor(hf_name)
        got = np.asarray(ours[g_name].data)
        if got.size != want.size or not np.array_equal(got.reshape(want.shape), want):
            out.append(f"{g_name} differs from {hf_name}")
    return out
