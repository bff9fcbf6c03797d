"""The benchmark tables' primitives: a number as a cell ("-" where there is none), a path
into a JSON that may lack it, and a Markdown table."""
from __future__ import annotations

import math

UNKNOWN = "unknown"


def num(v, fmt: str = ".1f") -> str:
    if v is None or isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, fmt)


def get(doc, *path):
    """doc[path[0]][path[1]]..., or None where any step is missing."""
    for k in path:
        if not isinstance(doc, dict) or k not in doc:
            return None
        doc = doc[k]
    return doc


def markdown(header: tuple, rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# the engine's serve flags a compare JSON names beyond those every run passes
SERVE_FLAGS_SHOWN = ("--prefill-bf16", "--int8-activations")


def engine_flags(doc: dict) -> str:
    """` --prefill-bf16` (or another flag shown) where the engine ran with it (compare's serve_args), else ""."""
    args = get(doc, "engine", "serve_args") or []
    return "".join(f" `{a}`" for a in args if a in SERVE_FLAGS_SHOWN)
