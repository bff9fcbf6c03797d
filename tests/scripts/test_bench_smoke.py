"""Keeps the serving benchmarks working: `scripts/bench serve`, `prefix`, `scale`, `whatif`
and `embed` on tiny.

Checks only that it runs to the end and writes its figures; no timing is asserted.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from scripts import ROOT
KEYS = {"requests", "completed", "errors", "output_tokens", "wall_s", "output_tok_s",
        "requests_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "preemptions", "steps",
        "workload", "machine"}


@pytest.mark.slow  # keeps the default suite under 5 minutes; CI runs it
def test_bench_serve_tiny(tmp_path):
    out = tmp_path / "serve.json"
    cmd = [str(ROOT / "scripts" / "bench"), "serve", "--model", "tiny", "--requests", "4",
           "--prompt-len", "8-32", "--output-len", "4-12", "--rate", "50",
           "--no-progress", "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert KEYS <= set(doc)
    assert doc["completed"] == doc["requests"] == 4
    assert doc["output_tokens"] == doc["workload"]["max_output_tokens"]  # EOS ignored
    assert set(doc["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}


@pytest.mark.slow
def test_bench_prefix_tiny(tmp_path):
    out = tmp_path / "prefix.json"
    cmd = [str(ROOT / "scripts" / "bench"), "prefix", "--model", "tiny", "--requests", "6",
           "--system-len", "48", "--output-len", "4", "--rate", "50", "--conversations", "2",
           "--turns", "2", "--mixed", "3", "--no-progress", "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["on"]["shared_steady"]["prefix_hit_tokens"] > 0
    assert doc["off"]["shared_steady"]["prefix_hit_tokens"] == 0
    assert set(doc["ratios"]) == {"shared_t0", "shared_steady", "mixed"}


@pytest.mark.slow
def test_bench_scale_tiny(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [str(ROOT / "scripts" / "bench"), "scale", "--model", "tiny", "--requests", "3",
           "--no-progress", "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["settings"]) == {"dp1", "dp2", "tp1", "tp2"}
    assert all(m["completed"] == 3 for m in doc["settings"].values())
    assert set(doc["ratios"]) == {"throughput dp2/dp1", "throughput tp2/tp1"}


@pytest.mark.slow
def test_bench_whatif_quick(tmp_path):
    out = tmp_path / "whatif.json"
    cmd = [str(ROOT / "scripts" / "bench"), "whatif", "--model", "tiny", "--quick",
           "--no-progress", "--keep", str(tmp_path / "logs"), "--allow-dirty",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    for run in ("a", "b"):
        assert set(doc[run]) == {"measured", "predicted", "errors"}
        assert doc[run]["measured"]["makespan_s"] > 0 and doc[run]["predicted"]["makespan_s"] > 0
    assert set(doc["goals"]) == {"a", "b"} and set(doc["fit"]) == {"r2", "mape"}


@pytest.mark.slow
def test_bench_embed_tiny(tmp_path):
    """scripts/bench embed: each turn's requests all answered, the prompt tokens counted."""
    out = tmp_path / "embed.json"
    cmd = [str(ROOT / "scripts" / "bench"), "embed", "--model", "tiny", "--requests", "4",
           "--prompt-len", "8-32", "--output-len", "4", "--rounds", "1", "--no-progress",
           "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    [turns] = doc["rounds"]
    for name in ("embed", "prefill", "generate"):
        assert turns[name]["errors"] == 0 and turns[name]["input_tokens"] == \
            doc["workload"]["prompt_tokens"], turns[name]
    assert turns["generate"]["output_tokens"] == 4 * 4   # EOS ignored
