"""Keep freed memory in the process heap (glibc), so a step's large tensors reuse pages.

By default glibc serves allocations over its mmap threshold with fresh mmaps and returns
freed heap tops to the kernel; every step then page-faults its multi-MB tensors (the
decode gather, the MLP activations) back in, zero-filled. On smol at 64 decodes of 300
tokens this made a step take 463 ms instead of 235 ms. Raising the thresholds keeps those
pages mapped; the heap grows to the step's peak and stays there. What a load frees is not a
step's: `trim` hands it back once, when the load ends.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20   # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_NEVER = (1 << 31) - 1      # mallopt takes an int
TOP_PAD = 64 << 20


def keep_heap() -> bool:
    """True if glibc took the settings; False elsewhere (other libcs keep their defaults)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, TRIM_NEVER),
                (M_TOP_PAD, TOP_PAD))
    return all(mallopt(opt, value) == 1 for opt, value in settings)


def trim() -> bool:
    """Hand the heap's free pages back to the system now (glibc's malloc_trim), whatever the
    trim threshold keep_heap set: once, at the end of a load (worker/load.py), so that what
    the load freed (float weights a quantized layer replaced, the probes', the fused layers'
    and the decode graph's temporaries: 0-80 MB on smollm2, as the allocations happened to
    fall) is not kept as if a step would need it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
