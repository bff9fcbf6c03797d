"""One fresh process of `scripts/bench memory`: makes the runner as the worker does
(worker/load.py make_runner), runs a short prompt and a few decode steps, and prints one JSON
line of its memory read from /proc/self/status: once the modules a load imports are
imported (`imported`: the runtime, no model byte yet), once loaded, and after the steps.

    python -P scripts/benchmarks/_memory_child.py MODEL NUM_BLOCKS STEPS [--dequantize]

Imports nothing of scripts/: run with -P and PYTHONPATH set to a checkout, it measures that
checkout's worker (the parent's --checkout).
"""
from __future__ import annotations

import importlib
import json
import sys
import time

PROMPT = 16   # tokens prefilled before the decode steps
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
# what make_runner imports on the way, before it reads a weight
RUNTIME = ("torch", "transformers", "transformers.modeling_utils", "worker.load",
           "worker.runner", "worker.handmade")


def status() -> dict[str, float]:
    """MB of each of FIELDS, as the kernel counts them for this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) / 1024   # kB
    return out


def main(argv: list[str]) -> int:
    model, num_blocks, steps = argv[0], int(argv[1]), int(argv[2])
    dequantize = "--dequantize" in argv[3:]
    t0 = time.perf_counter()
    for name in RUNTIME:
        importlib.import_module(name)
    imported = status()
    from worker.handmade import blocks_needed, generate_alone
    from worker.load import make_runner
    runner = make_runner(model, num_blocks=num_blocks, batch_invariant=None,
                         dequantize=dequantize)
    loaded = status()
    load_s = time.perf_counter() - t0
    bs = runner.info.block_size
    table = list(range(blocks_needed(PROMPT + steps, bs)))
    prompt = [(7 * i + 1) % runner.info.vocab_size for i in range(PROMPT)]
    tokens = generate_alone(runner, prompt, steps, table)
    print(json.dumps({"dequantize": dequantize, "imported": imported, "loaded": loaded,
                      "after_steps": status(), "load_s": load_s, "modules": len(sys.modules), "tokens": tokens,
                      "quantization": runner.info.quantization["mode"],
                      "num_blocks": runner.info.num_blocks}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
