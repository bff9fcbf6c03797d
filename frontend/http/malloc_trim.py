"""Give the gateway's free heap back to the kernel (glibc's malloc_trim), every reap.

A whole reply is built in memory (up to reply_bound.py's bound, ~13 MB of JSON and several
times that in Python objects while it is built); once it is sent, glibc keeps most of the
freed pages in the process: four such replies at once left the gateway ~110 MB larger
for good. Trimming every REAP_S seconds (server.py) returns them; with nothing to return
it costs a walk of the free lists. Elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util


class HeapTrim:
    def __init__(self):
        try:
            self._trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None
        else:
            self._trim.argtypes = (ctypes.c_size_t,)

    def __call__(self) -> None:
        if self._trim is not None:
            self._trim(0)
