"""worker/prebuild.py: a CPU runner's kernels compile side by side while the model's
metadata is read, so a cold start does not wait for them one after another."""
from __future__ import annotations

import subprocess
import sys

import pytest

from scripts import ROOT
from worker import prebuild


def test_nothing_is_built_off_the_cpu_or_with_the_kernels_off(monkeypatch):
    calls = []
    monkeypatch.setattr("worker.linear.quant.kernel", lambda: calls.append("quant"))
    assert prebuild.start("cuda")() is None
    monkeypatch.setenv("TL_NATIVE", "0")
    assert prebuild.start("cpu")() is None
    assert calls == []


@pytest.mark.slow
def test_a_cold_cache_gets_every_kernel_before_the_weights_load(tmp_path):
    """In a fresh process on an empty cache, start() then its wait leaves the four
    libraries built: the loaders after it find them (and compile nothing)."""
    code = ("import torch\n"
            "from worker import prebuild\n"
            "from worker.presets import cache_root\n"
            "prebuild.start('cpu')()\n"
            "print(sorted(p.name.split('-')[0] for p in (cache_root().parent / 'native').glob('*.so')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "TL_CACHE_DIR": str(tmp_path),
                              "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['paged_decode', 'quant_gemm', 'row_ops', 'torch_ops']"
