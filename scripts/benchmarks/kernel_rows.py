#!/usr/bin/env python
"""The quantized kernel alone (worker/csrc/quant_gemm.c): tl_quant_matmul at a 1B Llama's
shapes for each type, at 1, 8 and 64 rows, in GB/s of weight blocks read and GFLOP/s, beside
a plain read of memory in the same run. One row is a one-request decode step: there the
kernel should read its blocks as fast as memory gives them.

Each shape's weight is repeated in copies that together exceed the last-level cache (a
decode step reads every layer once, from memory), and calls cycle through them. Builds
(this checkout's native build, its AVX2 build, and optionally another quant_gemm.c such as
main's as the baseline) are timed alternately, round by round, so that a noisy machine's
load falls on all of them alike: compare the ratios.

    .venv/bin/python -m scripts.benchmarks.kernel_rows [--types Q4_0,Q4_K,Q6_K,Q8_0]
        [--rows 1,8,64] [--threads 2] [--baseline /work/main/worker/csrc/quant_gemm.c]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from worker import native
from worker.linear import quant

# (in, out): q/o, k/v, gate/up, down, the output head
SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 49152)]
WORKING_SET = 256 << 20   # bytes of copies per shape: well past the L3 cache


def blocks(qtype: quant.QuantType, out: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """Random blocks with finite fp16 scales (a fixed small value: speed ignores values)."""
    raw = rng.integers(0, 256, (out, k // qtype.block, qtype.block_bytes), dtype=np.uint8)
    half = np.array([0.002], dtype=np.float16).view(np.uint8)
    for at in (208,) if qtype.name == "Q6_K" else (0, 2):
        raw[..., at:at + 2] = half
    return torch.from_numpy(raw.reshape(out, -1))


def builds(baseline: str | None) -> dict[str, ctypes.CDLL]:
    libs = {"avx512" if quant.isa() == "avx512" else quant.isa(): quant.kernel(),
            "avx2": quant.load(("-mno-avx512f",))}
    if baseline:
        for name, flags in (("base", ()), ("base-avx2", ("-mno-avx512f",))):
            lib = native.load(Path(baseline), "baseline unavailable", (*flags, *quant.LIBS))
            lib.tl_quant_matmul.argtypes = quant.load().tl_quant_matmul.argtypes
            libs[name] = lib
    return {k: v for k, v in libs.items() if v is not None}


def seconds(lib, x: torch.Tensor, copies: list[torch.Tensor], qtype, k: int, out: int,
            threads: int, budget: float) -> float:
    """Median seconds of one call, cycling through the copies for about `budget` s; nan
    where the build refuses the type (main's kernel has no K-quants)."""
    y = torch.empty(x.shape[0], out)
    times = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < budget or len(times) < 5:
        w = copies[i % len(copies)]
        t = time.perf_counter()
        rc = lib.tl_quant_matmul(x.data_ptr(), w.data_ptr(), qtype.ggml_id, None, y.data_ptr(),
                                 x.shape[0], k, out, threads)
        times.append(time.perf_counter() - t)
        if rc:
            return float("nan")
        i += 1
    return statistics.median(times)


def read_bandwidth(threads: int) -> float:
    """GB/s of torch summing 512 MB of float32 (the memory's read speed, plainly)."""
    torch.set_num_threads(threads)
    buf = torch.ones(128 << 20)
    buf.sum()
    best = min(_timed(buf.sum) for _ in range(5))
    return buf.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_0,Q4_K,Q6_K,Q8_0", help="comma-separated block types")
    p.add_argument("--rows", default="1,8,64", help="comma-separated rows a call")
    p.add_argument("--shapes", default="all", help="all, or indices into SHAPES: 0,2")
    p.add_argument("--threads", type=int, default=2, help="the kernel's threads")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the builds")
    p.add_argument("--budget", type=float, default=0.15, help="seconds a build, a round")
    p.add_argument("--baseline", help="another quant_gemm.c, timed alike (e.g. main's)")
    a = p.parse_args()
    libs, rng = builds(a.baseline), np.random.default_rng(0)
    shapes = SHAPES if a.shapes == "all" else [SHAPES[int(i)] for i in a.shapes.split(",")]
    print(f"load: {os.getloadavg()}; read bandwidth {read_bandwidth(a.threads):.1f} GB/s "
          f"({a.threads} threads, torch sum of 512 MB)")
    print(f"{'type':5} {'rows':>4} {'k':>5} {'n':>6}  " +
          "  ".join(f"{n + ' GB/s':>13} {'GFLOP/s':>7}" for n in libs))
    for name in a.types.split(","):
        qtype = quant.TYPES[name]
        for k, out in shapes:
            one = blocks(qtype, out, k, rng)
            size = one.numel()
            copies = [one] + [one.clone() for _ in range(max(0, WORKING_SET // size - 1))]
            for m in map(int, a.rows.split(",")):
                x = torch.randn(m, k)
                got = {n: [] for n in libs}
                for _ in range(a.rounds):
                    for n, lib in libs.items():
                        got[n].append(seconds(lib, x, copies, qtype, k, out, a.threads,
                                              a.budget))
                cells = []
                for n in libs:
                    s = statistics.median(got[n])
                    cells.append(f"{size / s / 1e9:13.1f} {2 * m * k * out / s / 1e9:7.1f}")
                print(f"{name:5} {m:4} {k:5} {out:6}  " + "  ".join(cells), flush=True)
            del copies, one


if __name__ == "__main__":
    main()
