"""The C decode-attention kernel (worker/csrc/paged_decode.c): built once per machine with the
system C compiler, loaded with ctypes (`load` builds the other kernels of worker/csrc/ alike).
Absent (no compiler, not glibc/Linux, TL_NATIVE=0) the worker keeps the torch path, which
gives the same results up to fp32 rounding.

The library links libgomp by soname; torch has already loaded its own libgomp.so.1, so
the kernel's OpenMP threads are torch's pool, not a second one competing for the cores.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def enabled() -> bool:
    return os.environ.get("TL_NATIVE", "1") != "0"


@cache
def kernel():
    """The loaded library (tl_paged_decode, tl_paged_decode_supports), or None, with one
    line on stderr saying why."""
    return attention_lib() if enabled() else None


def attention_lib(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """paged_decode.c built with `flags` after FLAGS (tests build other instruction sets),
    its functions typed; None where it cannot be built."""
    lib = load(SOURCE, "native decode attention unavailable, using torch", flags)
    if lib is None:
        return None
    lib.tl_paged_decode.argtypes = (_P, _P, _P, _P, _I64, _P, _INT, _INT, _INT, _INT, _INT,
                                    _F, _P, _INT)
    lib.tl_paged_decode.restype = _INT
    lib.tl_paged_decode_supports.argtypes = (_INT, _INT)
    lib.tl_kv_write.argtypes = (_P, _I64, _I64, _P, _I64, _P, _P, _P, _P, _INT, _INT)
    lib.tl_kv_write.restype = _INT
    return lib


def load(source: Path, unavailable: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built from `source` (with `extra` compiler arguments after FLAGS and the
    source), or None with the line `unavailable: why` on stderr (no compiler, a failed
    build, a library that does not load)."""
    try:
        return ctypes.CDLL(str(build(source, extra)))
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        print(f"[worker] {unavailable}: {e}", file=sys.stderr, flush=True)
        return None


def build(source: Path, extra: tuple[str, ...] = (), compiler: str | None = None) -> Path:
    """The shared library for `source` (a file of csrc/), these arguments, this compiler
    (default: the C compiler) and this CPU, compiled if missing."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    key = hashlib.blake2b(digest_size=8)
    for text in _sources(source):
        key.update(text)
    for part in (cc, *FLAGS, *extra, _compiler_version(cc), cpu_flags()):
        key.update(part.encode())
    from worker.presets import cache_root
    out = cache_root().parent / "native" / f"{source.stem}-{key.hexdigest()}.so"
    if not out.exists():
        _compile(cc, source, out, extra)
    return out


def _sources(source: Path, seen: frozenset[Path] = frozenset()) -> list[bytes]:
    """The bytes of `source` and of every header it includes by `#include "name"`, at any
    depth (the build cache's key covers them: a changed header builds anew)."""
    text = source.read_bytes()
    out = [text]
    for name in re.findall(rb'^\s*#\s*include\s+"([^"]+)"', text, re.M):
        header = source.parent / name.decode()
        if header not in seen and header.exists():
            out += _sources(header, seen | {source, header})
    return out


def _compile(cc: str, source: Path, out: Path, extra: tuple[str, ...]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, "-o", tmp, str(source), *extra], capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {r.stderr.strip()[:500]}")
        os.replace(tmp, out)  # atomic: concurrent workers each build, one copy wins
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compiler_version(cc: str) -> str:
    r = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    return r.stdout.splitlines()[0] if r.stdout else ""


def cpu_flags() -> str:
    """-march=native code runs only where these flags hold."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


FAST_DIMS = (64, 128)  # head dims the kernel has unrolled code for


def usable(kv: torch.Tensor, rep: int, any_dim: bool = False) -> bool:
    """For a pool [layers, 2, blocks, B, kv_heads, head_dim] and rep query heads per KV head.
    The serving default takes the kernel for FAST_DIMS only; `any_dim` (the batch-invariant
    mode, which needs it) for every head dim it supports."""
    if kv.device.type != "cpu" or kv.dtype != torch.float32 or not kv.is_contiguous():
        return False
    if not any_dim and kv.shape[-1] not in FAST_DIMS:
        return False
    lib = kernel()
    return lib is not None and bool(lib.tl_paged_decode_supports(kv.shape[-1], rep))


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor,
                 ctx: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, H, D]; k, v [blocks, B, KVH, D]; tables [n, W] and ctx [n] int64 -> [n, H, D]."""
    if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
        return torch.ops.tl.paged_decode(q, k, v, tables, ctx, scale)
    return kernel_decode(q, k, v, tables, ctx, scale)


def kernel_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor,
                  ctx: torch.Tensor, scale: float,
                  lib: ctypes.CDLL | None = None) -> torch.Tensor:
    q = q.contiguous()
    n, heads, dim = q.shape
    kv_heads, block = k.shape[2], k.shape[1]
    out = torch.empty_like(q)
    rc = (lib or kernel()).tl_paged_decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), tables.data_ptr(),
                                  tables.stride(0), ctx.data_ptr(), n, kv_heads,
                                  heads // kv_heads, dim, block, scale, out.data_ptr(),
                                  torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"native decode attention takes no head dim {dim} with "
                         f"{heads // kv_heads} query heads per KV head")
    if rc != 0:
        raise MemoryError("native decode attention could not allocate its scratch")
    return out


def kv_write(cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v [KVH, T, D] into one layer's pool `cache` [2, N, B, KVH, D] at `slots` [T]
    (int64 pool rows), as index_copy_ along the flattened rows would, in one call."""
    if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
        torch.ops.tl.kv_write(cache, slots, k, v)
        return
    kernel_kv_write(cache, slots, k, v)


def kernel_kv_write(cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    heads, tokens, dim = k.shape
    if (v.shape != k.shape or not cache.is_contiguous() or cache.shape[-2:] != (heads, dim)
            or {k.dtype, v.dtype, cache.dtype} != {torch.float32}
            or slots.dtype != torch.int64 or slots.shape != (tokens,)):
        raise ValueError(f"keys {list(k.shape)} and values {list(v.shape)} for a pool of "
                         f"{list(cache.shape)} at {list(slots.shape)} slots")
    k, v, s = _unit_last(k), _unit_last(v), slots.contiguous()
    ks = (ctypes.c_int64 * 2)(k.stride(0), k.stride(1))
    vs = (ctypes.c_int64 * 2)(v.stride(0), v.stride(1))
    half = cache[0].numel()
    rc = kernel().tl_kv_write(cache.data_ptr(), half, half // (heads * dim), s.data_ptr(),
                              tokens, k.data_ptr(), ks, v.data_ptr(), vs, heads, dim)
    if rc != 0:
        raise ValueError("slot_mapping points outside the KV pool")


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
