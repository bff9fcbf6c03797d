"""The C kernels a CPU runner loads, compiled at once and beside the model's load.

On a machine whose cache has no build of them yet (a fresh machine, a changed kernel, another
torch), the four libraries took ~10 s to compile one after another, and a 1B GGUF file's
metadata ~8 s of single-threaded Python to read before them: a cold start of 23 s. Started
first, on threads (each compile is a compiler process, so the GIL is free), they compile
side by side and while the metadata is read. Each library's own loader still builds what
is missing; `start` only makes sure that by the time it is wanted it is there. Nothing here
is required: a build that fails is said again, in its one line, by the loader that wants it.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def start(device: str) -> Callable[[], None]:
    """Begin compiling the CPU kernels (nothing on another device, or with the kernels off);
    returns the wait for them, to be called before the model's weights load."""
    from worker import native
    if device != "cpu" or not native.enabled():
        return lambda: None
    from worker import row_ops, torch_ops
    from worker.linear import quant
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="prebuild")
    jobs = [pool.submit(build) for build in (quant.kernel, torch_ops_build(torch_ops),
                                             row_ops.kernel, native.kernel)]
    pool.shutdown(wait=False)

    def wait() -> None:
        for job in jobs:
            job.exception()   # the loader that wants it reports a failure itself
    return wait


def torch_ops_build(torch_ops) -> Callable[[], object]:
    """torch_ops' compile, where its ops are on (their registration comes later)."""
    return torch_ops.build if torch_ops.enabled() and torch_ops.compiler() else (lambda: None)
