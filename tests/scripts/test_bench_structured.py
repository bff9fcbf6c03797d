"""scripts/bench structured: its workload (each constrained request a schema text the engine
has not seen, both sides the same lengths), its figures (the worker's grammar time as a
share of its steps, the ratios) and its report table; and, in the slow suite, `--quick` on
tiny end to end. No timing is asserted."""
from __future__ import annotations

import json
import math
import subprocess
from types import SimpleNamespace

import pytest

from frontend.structured import constraint_of
from scripts import ROOT
from scripts.benchmarks import _report_tables as rt
from scripts.benchmarks import _structured_work as sw
from scripts.benchmarks import _worker_times as wt
from scripts.benchmarks import common as bl
from scripts.benchmarks import structured
from scripts.benchmarks._schemas import schemas


def _workload(n: int = 3) -> sw.Workload:
    return sw.Workload([sw.Item([10 + i, 11, 12], s) for i, s in enumerate(schemas(n))],
                       SimpleNamespace(decode=lambda ids, skip_special_tokens: bytes(ids)
                                       .decode()))


def test_constrained_requests_carry_new_schema_texts_of_the_same_language():
    w = _workload()
    free = sw.requests(w, [5, 6, 7], False, "a")
    a, b = (sw.requests(w, [5, 6, 7], True, tag) for tag in ("r0", "r1"))
    assert [r.max_tokens for r in free] == [r.max_tokens for r in a] == [5, 6, 7]
    assert [r.prompt for r in free] == [r.prompt for r in a] and free[0].options == {}
    keys = {constraint_of(None, r.options["structured_outputs"]).key for r in a + b}
    assert len(keys) == 6                      # every request's grammar is built anew
    s = a[1].options["structured_outputs"]["json"]
    assert {k: v for k, v in s.items() if k != "title"} == w.items[1].schema


def _trace(text: str, reason: str) -> bl.Trace:
    return bl.Trace(0.0, tokens=list(text.encode()), finish_reason=reason)


def test_calibration_gives_each_request_its_length_and_counts_valid_outputs():
    w = _workload(3)
    run = bl.RunResult([_trace('{"name":"x","age":3}', "stop"),
                        _trace('{"city":"x"', "length"),
                        _trace('{"answer":"no","confidence":1}', "stop")], 1.0, {}, {})
    lengths, cal = sw.calibration(w, run, cap=25)
    assert lengths == [20, 11, 25]             # the third cut at the cap
    assert cal["finished_stop"] == 2 and cal["valid_json"] == 2
    assert cal["output_tokens"] == 56 and cal["errors"] == 0


def test_step_figures_take_the_grammar_share_of_the_worker_time():
    f = structured.step_figures([wt.StepTime(1, 10.0, 1.0), wt.StepTime(2, 30.0, 3.0)])
    assert f["worker_steps"] == 2 and f["mask_share"] == pytest.approx(0.1)
    assert f["mask_ms_per_step"]["mean"] == 2.0
    assert structured.step_figures([])["worker_steps"] == 0


def _system(tok_s: float, tpot: float = 10.0, rest: float = 8.0) -> dict:
    return {"output_tok_s": tok_s, "tpot_ms": {"p50": tpot, "p99": 2 * tpot},
            "mask_ms_per_step": {"p50": 1.5}, "rest_ms_per_step": {"mean": rest},
            "mask_share": 0.05}


def _doc() -> dict:
    systems = {"constrained": _system(90.0, 11.0, 10.0), "unconstrained": _system(100.0),
               "constrained_no_overlap": _system(60.0), "unconstrained_no_overlap": _system(80.0)}
    ms = {"p50": 1.0, "p99": 4.0}
    return {"benchmark": "structured", "systems": systems,
            "ratios": structured.ratios(systems),
            "goal": {"constrained_over_unconstrained_at_least": 0.9, "met": True},
            "compile": {"tokenizer_setup_ms": 3000.0, "cold_ms": ms, "cached_ms": ms,
                        "first_mask_cold_ms": ms, "first_mask_cached_ms": ms},
            "calibration": {"requests": 64, "valid_json": 61},
            "workload": {"in_flight": 64, "rounds": 4}}


def test_the_ratios_compare_like_with_like():
    r = _doc()["ratios"]
    assert r["constrained_over_unconstrained"] == pytest.approx(0.9)
    assert r["constrained_over_unconstrained_no_overlap"] == pytest.approx(0.75)
    assert r["overlap_gain_constrained"] == pytest.approx(1.5)
    assert r["overlap_gain_unconstrained"] == pytest.approx(1.25)
    assert r["tpot_p50_constrained_over_unconstrained"] == pytest.approx(1.1)
    assert r["worker_rest_constrained_over_unconstrained"] == pytest.approx(1.25)
    assert math.isnan(structured.ratios({n: {} for n in structured.SYSTEMS})[
        "constrained_over_unconstrained"])


def test_the_report_renders_the_structured_json():
    doc = _doc()
    assert rt.kind(doc) == "structured"
    text = rt.table(doc)
    assert "| each under its schema | on | 90.0 | 11 / 22 | 1.50 | 5.0% |" in text
    assert "| free | off | 80.0 |" in text
    assert "0.90x overlapped (goal 0.9x: met), 0.75x without" in text
    assert "cold 1.000 / 4.000" in text and "61 of 64 outputs valid" in text
    assert "(no table" not in rt.table({"systems": {}, "compile": {}})   # partial: dashes


@pytest.mark.slow   # two groups, compile times and 8 passes: ~60 s on the shared 2 cores
def test_bench_structured_quick_on_tiny(tmp_path):
    out = tmp_path / "structured.json"
    cmd = [str(ROOT / "scripts" / "bench"), "structured", "--quick", "--model", "tiny",
           "--no-progress", "--allow-dirty", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["systems"]) == set(structured.SYSTEMS) and doc["benchmark"] == "structured"
    tokens = {m["output_tokens"] for m in doc["systems"].values()}
    assert tokens == {2 * sum(doc["lengths"])}          # both sides, both rounds, same lengths
    assert doc["systems"]["constrained"]["mask_ms_per_step"]["mean"] > 0
    assert doc["systems"]["unconstrained"]["mask_ms_per_step"]["mean"] == 0
    assert doc["compile"]["cold_ms"]["n"] == 8
