"""core/config.py: the engine a core builds and the one replay rebuilds from the log's meta
are configured alike."""
from __future__ import annotations

import json

import pytest

from core.config import CoreConfig, engine_from_meta, log_meta
from core.ipc.protocol import ModelInfo
from core.sched import Chunked

INFO = ModelInfo("m", num_blocks=40, block_size=8, max_model_len=512, vocab_size=300,
                 eos_ids=[256, 257])


def setup(engine) -> tuple:
    s = engine.sched
    chunk = s.prefill_policy.max_chunk if isinstance(s.prefill_policy, Chunked) else None
    return (s.cfg, type(s.prefill_policy), chunk, s.blocks.block_tokens(),
            s.blocks.total_blocks(), engine.eos_ids, engine.seed)


@pytest.mark.parametrize("prefill", ["chunked", "whole"])
def test_make_engine_and_engine_from_meta_agree(prefill):
    cfg = CoreConfig("-", "-", "-", "-", max_seqs=9, policy="fcfs", aging_steps=None,
                     max_model_len=100, prefill=prefill, max_chunk=24, seed=5)
    meta = json.loads(json.dumps(log_meta(cfg, INFO)))   # as the log stores it
    made = setup(cfg.make_engine(INFO))
    assert setup(engine_from_meta(meta)) == made
    assert made[0].max_seqs == 9 and made[0].max_model_len == 100
    assert made[2:] == (24 if prefill == "chunked" else None, 8, 40, frozenset({256, 257}), 5)
