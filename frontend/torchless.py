"""The frontend's processes (`python -m frontend`, `python -m frontend.http`) run without
torch. They need a tokenizer and a chat template, and torch serves neither; but transformers
imports torch whenever it is installed (its config module imports the rope utilities, which
import torch). On 2 cores that import was ~3 s of each process's start, and it held 240 MB
of its 310 MB resident. Docs: docs/design/processes.md, "The frontend runs without torch"."""
from __future__ import annotations

import os
import sys


def forbid_torch() -> None:
    """From here on `import torch` fails in this process, so transformers finds no torch and
    builds the same `tokenizers` tokenizer without it. A process that has torch already
    keeps it: the entry points call this first."""
    if "torch" in sys.modules:
        return
    sys.modules["torch"] = None   # the import system's own "no such module" (ModuleNotFoundError)
    # transformers would say "PyTorch was not found" on stderr: expected here, not news
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
