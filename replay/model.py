"""The worker a log was made with, rebuilt for `verify --with-model`."""
from __future__ import annotations


def runner_for(meta: dict):
    from worker.load import make_runner
    info = meta["model_info"]
    return make_runner(meta["model"], device="cpu", dtype=info.get("dtype", "float32"),
                       num_blocks=meta["num_blocks"], block_size=meta["block_size"],
                       max_model_len=info["max_model_len"])
