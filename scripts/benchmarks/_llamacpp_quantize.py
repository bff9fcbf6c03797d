"""A GGUF file re-quantized with llama.cpp's own `llama-quantize` (built and cached as
llama-server is), for `scripts/bench compare --peer llamacpp --gguf FILE --gguf-type Q8_0`:
both systems then serve the very file llama.cpp wrote."""
from __future__ import annotations

import hashlib
from pathlib import Path

from scripts.benchmarks import _llamacpp_get as get

# F32: the source's values, dequantized; Q4_K and Q5_K are llama-quantize's names for
# Q4_K_M and Q5_K_M
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_K", "Q5_K",
         "F32")


def requantized(src: Path, qtype: str) -> Path:
    """`src` as `qtype`, written once into the cache (keyed by the source's bytes)."""
    if qtype not in TYPES:
        raise ValueError(f"--gguf-type takes {', '.join(TYPES)}, not {qtype!r}")
    key = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = get.home() / "gguf" / f"{src.stem}-{key}.{qtype}.gguf"
    if out.is_file():
        return out
    tool = get.ensure_tool("llama-quantize")
    with get._locked("quantize"):
        if out.is_file():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        get._say(f"llama.cpp: quantizing {src.name} to {qtype} ({out})")
        # --allow-requantize: the source may itself be quantized (the registry's Q4_1)
        get._run([tool, "--allow-requantize", src, tmp, qtype], get.home() / "quantize.log",
                 "llama-quantize")
        tmp.replace(out)
    return out
