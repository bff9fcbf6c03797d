"""Keep freed memory in the process heap (glibc), so a step's large tensors reuse pages.

By default glibc serves allocations over its mmap threshold with fresh mmaps and returns
freed heap tops to the kernel; every step then page-faults its multi-MB tensors (the
decode gather, the MLP activations) back in, zero-filled. On smol at 64 decodes of 300
tokens this made a step take 463 ms instead of 235 ms. Raising the thresholds keeps those
pages mapped; the heap grows to the step's peak and stays there. The threshold stops at 32
MB (glibc's most), and a prompt chunk of a 1B model has larger tensors (the MLP's 1,000 x
16,384 float32 product is 66 MB), so mmap is turned off as well: every allocation comes
from the heap. A 1B `Q4_K_M` prefill of 8 prompts of 500 tokens then page-faulted 0.8-0.9
million times instead of 2.1-3.4 million and took 14.8-15.3 s instead of 16.8-22.7 (Zen 5,
3 alternating runs).

What a load frees is not a step's: `trim` hands it back once, when the load ends. Nor is a
long prompt's peak what an idle worker should hold: `IdleTrim` hands the free pages back
once the worker has waited IDLE_TRIM_S for its next batch (worker/process.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD_MAX = 32 << 20   # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_NEVER = (1 << 31) - 1      # mallopt takes an int
TOP_PAD = 64 << 20
# A worker this long without a batch after a step hands its heap's free pages back: far
# longer than the gap between two steps of a running batch (milliseconds), short enough that
# an idle server soon holds no prompt's peak.
IDLE_TRIM_S = 1.0


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once (find_library runs `ldconfig -p`, and IdleTrim trims
    after every idle spell); None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_heap() -> bool:
    """True if glibc took the settings; False elsewhere (other libcs keep their defaults)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_MMAP_MAX, 0),
                (M_TRIM_THRESHOLD, TRIM_NEVER), (M_TOP_PAD, TOP_PAD))
    return all(mallopt(opt, value) == 1 for opt, value in settings)


def trim() -> bool:
    """Hand the heap's free pages back to the system now (glibc's malloc_trim), whatever the
    trim threshold keep_heap set: at the end of a load (worker/load.py), so that what the
    load freed (float weights a quantized layer replaced, the probes', the fused layers' and
    the decode graph's temporaries: 0-80 MB on smollm2, as the allocations happened to fall)
    is not kept as if a step would need it, and after an idle spell (IdleTrim)."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    return malloc_trim is not None and bool(malloc_trim(0))


class IdleTrim:
    """`trim` once the worker has waited `idle_s` with nothing to run, after a step: the
    heap a busy worker keeps (above) is not held through an idle spell."""

    def __init__(self, idle_s: float = IDLE_TRIM_S, trim_fn: Callable[[], bool] = trim):
        self.idle_s, self.trim_fn = idle_s, trim_fn
        self.stepped = False   # a step ran since the last trim

    def step_ran(self) -> None:
        self.stepped = True

    def wait(self, poll: Callable[[int], bool]) -> None:
        """Before a blocking receive: `poll(ms)` says whether a message came within ms."""
        if self.stepped and not poll(int(self.idle_s * 1000)):
            self.trim_fn()
            self.stepped = False
