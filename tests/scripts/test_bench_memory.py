"""Keeps `scripts/bench memory` working: on tiny (no quantized layers: both settings load the
same float model), one round, its JSON written. No figure is asserted beyond being read."""
from __future__ import annotations

import json
import subprocess

import pytest

from scripts import ROOT


@pytest.mark.slow   # two fresh processes that import torch: 10-40 s by the machine's load
def test_bench_memory_tiny(tmp_path):
    out = tmp_path / "memory.json"
    cmd = [str(ROOT / "scripts" / "bench"), "memory", "--model", "tiny", "--num-blocks", "8",
           "--steps", "2", "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "memory" and doc["model"]["name"] == "tiny"
    for name, flag in (("quantized", False), ("dequantized", True)):
        (run,) = doc["runs"][name]
        assert run["dequantize"] is flag and run["quantization"] == "none"
        assert run["num_blocks"] == 8 and len(run["tokens"]) == 2
        assert 50 < run["after_steps"]["VmRSS"] <= run["after_steps"]["VmHWM"]
        assert 50 < run["imported"]["VmRSS"] < run["after_steps"]["VmRSS"]
    assert 0.5 < doc["summary"]["ratio_rss"] < 2
    assert doc["summary"]["ratio_model"] > 0
