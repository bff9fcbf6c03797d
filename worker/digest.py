"""The weights' digest: what a joining replica must match (docs/design/processes.md, "Joined replicas").

A replica's name, path and tokenizer say nothing of what its files hold: a checkpoint
edited in place, or another one at the same path on another machine, would give other
tokens, and a request re-run there would splice two models' streams. So the worker hashes
the weights as loaded (after the dtype cast; with --tp, this rank's shards), and the
frontend compares the digests.
"""
from __future__ import annotations

import hashlib


def weights_digest(model) -> str:
    """sha256 over every tensor of the state dict in name order: name, dtype, shape, bytes.
    Tied weights count under each name. ~1 s per 500 MB on a CPU core."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        local = t.to_local() if hasattr(t, "to_local") else t   # a --tp shard (DTensor)
        local = local.detach().to("cpu").contiguous()
        h.update(f"{name}|{local.dtype}|{tuple(local.shape)}|".encode())
        # the tensor's own bytes, not a copy: a copy under the mmap threshold would stay
        # in the heap the worker keeps (worker/malloc.py)
        h.update(local.reshape(-1).view(torch.uint8).numpy() if local.numel() else b"")
    return h.hexdigest()
