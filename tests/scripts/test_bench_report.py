"""`scripts/bench report` and what every benchmark JSON records: the committed README tables
are what the report writes from the committed JSONs; a JSON from a dirty tree is refused
unless --allow-dirty; the systems compared take turns round by round. Fast, no group."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import _report_tables as rt
from scripts.benchmarks import report


def test_the_readme_tables_are_what_the_report_writes_from_the_committed_jsons(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def _root(tmp_path: Path, doc: dict) -> Path:
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / "quality.json").write_text(json.dumps(doc))
    (tmp_path / "README.md").write_text(f"# x\n\n{report.BEGIN}\nold\n{report.END}\ntail\n")
    return tmp_path


def test_check_diffs_a_stale_table_and_write_brings_it_up_to_date(tmp_path, capsys):
    root = _root(tmp_path, {"ppl_engine": 2.0, "ppl_transformers": 2.0, "tokens": 10})
    assert report.main(["--check"], root=root) == 1
    assert "+| tl-engine | 2.0000 | - |" in capsys.readouterr().out
    assert report.main([], root=root) == 0 and report.main(["--check"], root=root) == 0
    readme = (root / "README.md").read_text()
    assert readme.startswith("# x\n\n") and readme.endswith(f"{report.END}\ntail\n")
    assert "old" not in readme and "quality.json" in readme


def test_a_readme_without_the_markers_is_refused(tmp_path):
    root = _root(tmp_path, {"ppl_engine": 2.0})
    (root / "README.md").write_text("# no markers\n")
    assert report.main(["--check"], root=root) == 2


def test_a_json_without_provenance_renders_unknown():
    line = rt.provenance({"model": "smol"})
    assert line.startswith("commit unknown (unknown), unknown, load unknown before")
    assert "smol (weights unknown)" in line
    assert rt.table({"no": "kind"}) == "(no table for this JSON)"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_a_json_from_a_dirty_tree_is_refused_unless_allowed(tmp_path, capsys):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    _git(tmp_path, "add", "f")
    _git(tmp_path, "commit", "-qm", "one")
    clean = prov.begin("b", "out.json", False, root=tmp_path)
    assert clean.dirty is False and len(clean.commit) == 40
    (tmp_path / "f").write_text("2")
    assert prov.begin("b", None, False, root=tmp_path).dirty      # no JSON: nothing refused
    with pytest.raises(SystemExit) as e:
        prov.begin("b", "out.json", False, root=tmp_path)
    assert e.value.code == 2 and "--allow-dirty" in capsys.readouterr().err
    start = prov.begin("b", "out.json", True, root=tmp_path)
    doc = prov.stamp({"figure": 1, "model": "old"}, start, "tiny", root=tmp_path)
    assert list(doc)[:len(prov.KEYS)] == list(prov.KEYS) and doc["dirty"] is True
    assert doc["figure"] == 1 and doc["model"]["weights"] == "random"


def test_a_tree_dirtied_during_the_run_is_recorded_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    _git(tmp_path, "add", "f")
    _git(tmp_path, "commit", "-qm", "one")
    start = prov.begin("b", "out.json", False, root=tmp_path)
    (tmp_path / "g").write_text("new")
    assert prov.stamp({}, start, None, root=tmp_path)["dirty"] is True


def test_model_records_say_random_or_trained():
    tiny = prov.model_record("tiny")
    assert tiny["weights"] == "random" and tiny["preset"] == "tiny-v2" and "seed" in tiny
    trained = prov.model_record("smollm2")
    assert trained["weights"] == "trained" and len(trained["sha256"]) == 64
    assert prov.models_record(["null", "smol"])[1]["weights"] == "random"
    assert prov.models_record(None) is None


def test_a_real_size_file_is_labelled_random(tmp_path, monkeypatch):
    """The benchmarks' real-size files hold random weights in a real model's shape: their
    provenance says so (an earlier README called them trained)."""
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))
    from scripts.benchmarks import _real_size
    home = _real_size.home()
    home.mkdir(parents=True)
    (home / "llama1b.Q4_0.gguf").write_bytes(b"GGUF")
    (tmp_path / "mine.gguf").write_bytes(b"GGUF")
    made = prov.model_record(str(home / "llama1b.Q4_0.gguf"))
    assert made["weights"] == "random" and len(made["sha256"]) == 64
    assert "random weights: llama1b.Q4_0.gguf" in rt.model_text(made)
    assert prov.model_record(str(tmp_path / "mine.gguf"))["weights"] == "trained"


def test_turns_rotate_who_goes_first():
    assert cs.turns(("engine", "a", "b"), 4) == [("engine", "a", "b"), ("a", "b", "engine"),
                                                  ("b", "engine", "a"), ("engine", "a", "b")]
    assert cs.turns(("llamacpp", "engine"), 2) == [("llamacpp", "engine"), ("engine", "llamacpp")]
    assert cs.turns((), 2) == [(), ()]


def test_split_cuts_the_workload_into_consecutive_slices():
    assert cs.split(list(range(10)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert cs.split([1, 2], 5) == [[1], [2]]


def test_warmup_prompts_are_no_prefix_of_the_workload():
    from scripts.benchmarks import common as bl
    reqs = [bl.Req(list(range(100 * i, 100 * i + 40)), 8) for i in range(3)]
    for w in cs.warmup(reqs):
        assert not any(r.prompt[:16] == w.prompt[:16] for r in reqs)


def test_the_cpu_a_figure_came_from_is_said():
    """Figures from an AVX2 machine and an AVX-512 one do not compare (the panel kernel runs
    only on the latter): the line under a table names the CPU where the JSON records it."""
    doc = {"commit": "a" * 40, "dirty": False, "date": "d", "load_before": 0.5,
           "load_after": 0.7, "machine": {"cpu": "AMD EPYC", "cpu_vectors": "avx2"}}
    assert "on AMD EPYC (avx2)" in rt.provenance(doc)
    assert " on " not in rt.provenance({k: v for k, v in doc.items() if k != "machine"})


def test_a_gguf_comparison_is_labelled_by_its_model_and_file_type():
    from scripts.benchmarks.report import _llamacpp_file_rows, file_type
    assert file_type("/c/SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert file_type("/c/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e.Q8_0.gguf") == "Q8_0"
    doc = {"model": "/c/m.Q8_0.gguf", "levels": {"1": {
        "engine": {"output_tok_s": 40.0, "tpot_ms": {"p50": 20.0}},
        "llamacpp": {"output_tok_s": 50.0, "tpot_ms": {"p50": 16.0}},
        "engine_over_llamacpp_tok_s": 0.8, "engine_over_llamacpp_tpot_p50": 1.25}}}
    rows = _llamacpp_file_rows(doc)
    assert rows[0] == ("m Q8_0, out tok/s, 1 in flight: tl-engine / llama.cpp", "40.0",
                       "50.0", "0.80x")
    assert rows[1][0] == "m Q8_0, TPOT p50 ms, 1 in flight: tl-engine / llama.cpp"
    assert rows[1][3] == "1.25x"
    doc["model"] = {"name": "/c/m.Q4_1.gguf", "weights": "trained", "file": "m.Q4_1.gguf"}
    assert _llamacpp_file_rows(doc)[0][0].startswith("m Q4_1, ")
    doc["machine"] = {"cpu": "AMD EPYC", "cpu_vectors": "avx2"}   # the kernel's path differs
    assert _llamacpp_file_rows(doc)[0][0].startswith("m Q4_1 on avx2, ")


def test_a_comparison_with_prefill_bf16_says_so_and_gives_the_prefill_ratio():
    from scripts.benchmarks import _report_tables as rt
    from scripts.benchmarks.report import _llamacpp_prefill_rows
    doc = {"model": "/c/m.Q4_K_M.gguf", "engine": {"serve_args": ["--model", "x",
                                                                   "--prefill-bf16"]},
           "bandwidth_gb_s": 40.0, "levels": {"1": {
               "engine": {"output_tok_s": 40.0, "tpot_ms": {"p50": 20.0}},
               "llamacpp": {"output_tok_s": 50.0, "tpot_ms": {"p50": 16.0}},
               "engine_over_llamacpp_tok_s": 0.8, "engine_over_llamacpp_prefill": 1.6}}}
    rows = _llamacpp_prefill_rows(doc)
    assert rows[0][0].startswith("m Q4_K_M --prefill-bf16, out tok/s")
    assert rows[1][0] == "m Q4_K_M --prefill-bf16, TPOT p50 ms, 1 in flight: tl-engine / llama.cpp"
    assert rows[2][0] == "m Q4_K_M --prefill-bf16, prefill tok/s ratio, 1 in flight"
    assert rows[2][3] == "1.60x"
    table = rt.compare_llamacpp(doc)
    assert "tl-engine `--prefill-bf16`" in table and "| 1.60 |" in table
    doc["engine"]["serve_args"] = ["--model", "x"]
    assert "--prefill-bf16" not in rt.compare_llamacpp(doc)


def test_the_curve_table_gives_each_setting_and_the_cost():
    doc = {"curve_cost_us_per_request": 41.5, "workload": {"turns": 4, "requests": 256,
                                                           "inflight": 64},
           "settings": {"plain": {"median_us": 400.0, "min_us": 390.0, "max_us": 420.0},
                        "curve": {"median_us": 441.5, "min_us": 430.0, "max_us": 460.0}}}
    text = rt.table(doc)
    assert "| curve | 441.5 | 430.0 | 460.0 |" in text and "costs 41.5 us" in text, text


def test_the_llamacpp_table_gives_bandwidth_and_batched_bench():
    f = {"output_tok_s": 40.0, "tpot_ms": {"p50": 20.0, "p99": 30.0},
         "ttft_ms": {"p50": 5.0, "p99": 9.0}}
    doc = {"llamacpp": {}, "bandwidth_gb_s": 12.5, "bytes_per_token": {"bytes_per_token": 1000},
           "levels": {"1": {"engine": f, "llamacpp": f, "engine_bandwidth_gb_s": 3.0,
                            "engine_bandwidth_fraction": 0.24, "llamacpp_batched_bench_tok_s":
                            61.0}}}
    text = rt.table(doc)
    assert "3.00 (24%)" in text and "61.0" in text and "Triad 12.50 GB/s" in text, text


def test_the_readme_headline_names_no_directory_of_the_machine():
    from scripts.benchmarks.report import _no_dirs
    assert _no_dirs("model /root/.cache/x/m.Q4_0.gguf (trained weights: m.gguf, sha256 ab)") \
        == "model m.Q4_0.gguf (trained weights: m.gguf, sha256 ab)"
