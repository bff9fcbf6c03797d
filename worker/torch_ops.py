"""C++ kernels for the decode graph's hottest ops (csrc/torch_ops.cpp): a one-row step on
smollm2 calls `tl::quant_linear` 121 times, the row ops 91 times and the attention's two ops
60 times, and a Python kernel costs the graph ~10 us a call to enter Python (~2.5 ms a
step). A C++ kernel calls the same C function (csrc/quant_gemm.c, csrc/row_ops.c,
csrc/paged_decode.c) on the same arguments, so the bits do not change; the eager forward
keeps calling the Python kernels. Built once per torch version and CPU with the
C++ compiler against torch's own headers (~10 s); without one, or with TL_NATIVE=0 or
TL_TORCH_OPS=0, the Python kernels serve.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from worker import native

SOURCE = Path(__file__).parent / "csrc" / "torch_ops.cpp"
# the ops it has kernels for
OPS = ("quant_linear", "rms_norm", "add_rms_norm", "rope", "paged_decode", "kv_write")


def enabled() -> bool:
    return native.enabled() and os.environ.get("TL_TORCH_OPS", "1") != "0"


def register() -> bool:
    """Register the C++ kernels of OPS under `tl` (their schemas defined first, by
    worker/graph.py ops); True where it did, else False (with one line on stderr where the
    build failed). All or none: only once every C library they call has loaded."""
    if not enabled():
        return False
    from worker import row_ops
    from worker.linear import quant
    quant_lib, rows_lib, attention_lib = quant.kernel(), row_ops.kernel(), native.kernel()
    if quant_lib is None or rows_lib is None or attention_lib is None:
        return False
    try:   # loading registers the kernels (the library's static initializers)
        shim = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"[worker] C++ graph ops unavailable, their Python kernels serve: {e}",
              file=sys.stderr, flush=True)
        return False
    shim.tl_torch_ops_set(*(ctypes.cast(fn, ctypes.c_void_p) for fn in (
        quant_lib.tl_quant_matmul, rows_lib.tl_rms_norm, rows_lib.tl_rope,
        attention_lib.tl_paged_decode, attention_lib.tl_kv_write)))
    return True


def compiler() -> str | None:
    """The C++ compiler the kernels are built with: $CXX, else c++ or g++ on PATH."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def build() -> Path:
    """The C++ library of OPS for this torch, compiled if missing (worker/native.py build)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++) on PATH")
    root = Path(torch.__file__).parent
    flags = ("-std=c++17", "-w", f"-I{root / 'include'}",
             f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
             f"-L{root / 'lib'}", "-ltorch", "-ltorch_cpu", "-lc10",
             f"-DTL_TORCH_VERSION={torch.__version__.replace('+', '_')}")
    return native.build(SOURCE, flags, compiler=cxx)
