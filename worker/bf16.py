"""`--dtype bf16` (bfloat16) on the CPU: torch's linear layers go to oneDNN, which multiplies
bf16 with the CPU's bf16 dot-product instructions (AVX512_BF16's vdpbf16ps, or AMX) and
accumulates in float32. A CPU without them still runs bf16, oneDNN widening each bf16 to
float32 first: that fallback is named at load, since it is slower than float32 there."""
from __future__ import annotations

from pathlib import Path

NATIVE = ("avx512_bf16", "amx_bf16")
ALIASES = {"bf16": "bfloat16", "fp32": "float32"}


def dtype_name(text: str) -> str:
    """--dtype's value: `bf16` for bfloat16 (and `fp32`) accepted."""
    return ALIASES.get(text, text)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def fallback_note(device: str, dtype: str, flags: set[str] | None = None) -> str | None:
    """One line naming the fallback where bf16 runs on a CPU without bf16 instructions."""
    if device != "cpu" or dtype != "bfloat16":
        return None
    flags = cpu_flags() if flags is None else flags
    if any(f in flags for f in NATIVE):
        return None
    return ("[worker] --dtype bfloat16: this CPU has no bf16 dot-product instructions "
            f"({' or '.join(NATIVE)}); oneDNN widens bf16 to float32 for every matmul, "
            "slower than --dtype float32 here")
