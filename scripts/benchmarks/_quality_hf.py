"""The reference scorer of `scripts/bench quality`: the stock transformers model, loaded
from the same float32 checkpoint directory the engine serves (a GGUF file's weights
dequantized once, worker/gguf_convert.py), one forward per window, no paged cache."""
from __future__ import annotations

import os
from pathlib import Path

from scripts.benchmarks import _quality_ppl as qp


def score(checkpoint: Path, wins: list[list[int]], ctx: int) -> list[list[float]]:
    """Each window's scored logprobs (float32 log_softmax of float32 logits, as the
    engine's prompt logprobs are)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.eval()
    rows = torch.tensor(list(qp.scored_positions(ctx)))
    out = []
    with torch.inference_mode():
        for w in wins:
            ids = torch.tensor([w])
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits[rows - 1], dim=-1)
            out.append(lp.gather(1, ids[0, rows].unsqueeze(1)).squeeze(1).tolist())
    return out
