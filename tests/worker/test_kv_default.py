"""The default KV pool (worker/kv.py): contexts within a share of the memory left after the
weights, capped; one context where only that fits; a one-line refusal naming the flags
where none does. Memory figures are fake: nothing here depends on the machine."""
from __future__ import annotations

import pytest
import torch

from worker import kv
from worker.settings import problem

GIB = 1 << 30
BLOCK = 16
PER_BLOCK = 1 << 20          # a 1 MiB block: 64 KiB per token
LLAMA_1B = kv.KVShape(layers=16, kv_heads=8, head_dim=64)   # 64 KiB a token in float32


def blocks(max_model_len: int, available: int | None) -> int:
    return kv.default_blocks(PER_BLOCK, BLOCK, max_model_len, available)


def test_a_big_machine_holds_the_default_contexts():
    assert blocks(1024, 64 * GIB) == kv.DEFAULT_CONTEXTS * 1024 // BLOCK


def test_the_pool_is_capped_in_bytes():
    # 4 contexts of 65536 tokens are 16 GiB; the cap holds 8 GiB of them
    assert blocks(65536, 1024 * GIB) == kv.DEFAULT_KV_MEMORY // PER_BLOCK


def test_the_pool_takes_a_share_of_what_is_available():
    assert blocks(65536, 10 * GIB) == int(kv.DEFAULT_KV_FRACTION * 10 * GIB) // PER_BLOCK


def test_one_context_where_only_one_fits():
    # one 8192-token context is 0.5 GiB: over half of 0.75 GiB, within its 80 %
    assert blocks(8192, 3 * GIB // 4) == 8192 // BLOCK


def test_no_room_for_one_context_is_refused_naming_what_fits():
    with pytest.raises(ValueError) as e:
        blocks(131072, 4 * GIB)   # one context is 8 GiB
    msg = str(e.value)
    assert "\n" not in msg and "--kv-memory" in msg and "--num-blocks" in msg
    fits = int(msg.split("--max-model-len ")[1].split()[0])
    assert fits == int(0.8 * 4 * GIB) // PER_BLOCK * BLOCK
    assert blocks(fits, 4 * GIB) == fits // BLOCK   # and that length is served


def test_without_a_memory_figure_the_cap_alone_applies():
    assert blocks(131072, None) == kv.DEFAULT_KV_MEMORY // PER_BLOCK


def test_size_pool_counts_the_weights_not_loaded_yet():
    f32 = torch.float32
    # Llama-3.2-1B's full context (131072 tokens) is 8 GiB of float32 KV, the cap
    one = 131072 // BLOCK
    assert kv.size_pool(LLAMA_1B, BLOCK, f32, 131072, available=64 * GIB) == one
    assert kv.size_pool(LLAMA_1B, BLOCK, f32, 32768, available=64 * GIB) == 4 * 32768 // BLOCK
    assert kv.size_pool(LLAMA_1B, BLOCK, f32, 131072, available=12 * GIB) == one
    with pytest.raises(ValueError, match="--max-model-len"):
        kv.size_pool(LLAMA_1B, BLOCK, f32, 131072, available=12 * GIB, weights=4 * GIB)
    # the explicit sizes ignore the machine
    assert kv.size_pool(LLAMA_1B, BLOCK, f32, 131072, num_blocks=7, available=0) == 7
    assert kv.size_pool(LLAMA_1B, BLOCK, f32, 131072, kv_memory=10 * PER_BLOCK,
                        available=0) == 10


def test_meminfo_is_read_in_bytes(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    1234567 kB\n")
    assert kv.available_memory(info) == 1234567 * 1024
    info.write_text("MemTotal:       16000000 kB\n")
    assert kv.available_memory(info) is None
    assert kv.available_memory(tmp_path / "absent") is None


def test_serve_refuses_a_model_len_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(kv, "available_memory", lambda: 4096)   # bytes
    why = problem("tiny", max_model_len=2048)
    assert why is not None and "--max-model-len" in why
    assert problem("tiny", max_model_len=2048, num_blocks=64) is None
