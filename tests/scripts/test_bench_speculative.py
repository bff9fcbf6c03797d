"""scripts/bench speculative's pure parts: the copy-heavy prompts, the acceptance figures and
how turns are pooled. Fast, no group (the benchmark itself is run by hand on a quiet machine)."""
from __future__ import annotations

from scripts.benchmarks import speculative as sp


def test_copy_prompts_alternate_repeating_and_lightly_editing_whole_paragraphs():
    qs = sp.copy_questions(4)
    assert qs[0].startswith("Repeat the following paragraph exactly") and "replacing" in qs[1]
    paras = sp.paragraphs()
    assert len(paras) >= 4 and qs[0].endswith(paras[0]) and qs[2].endswith(paras[2])


def test_acceptance_and_tokens_per_decode_step():
    m = {"accepted_tokens": 30, "draft_tokens": 40, "output_tokens": 104, "steps": 28}
    s = sp.speculation(m, 4)   # 4 requests: 4 prefill steps, 24 decode steps, 100 tokens
    assert s["acceptance"] == 0.75 and abs(s["tokens_per_decode_step"] - 100 / 24) < 1e-12
    assert sp.speculation({**m, "draft_tokens": 0}, 4)["acceptance"] is None


def test_turns_pool_by_median_and_sum_and_only_level_one_counts_steps():
    turn = lambda tpot, tok_s: {"tpot_ms": {"p50": tpot}, "output_tok_s": tok_s,  # noqa: E731
                                "draft_tokens": 8, "accepted_tokens": 4, "output_tokens": 20,
                                "steps": 12, "errors": 0}
    ms = [turn(10.0, 50.0), turn(30.0, 10.0), turn(20.0, 40.0)]
    p = sp.pooled(ms, 2, 1)
    assert p["tpot_ms_p50"] == 20.0 and p["output_tok_s"] == 40.0 and p["draft_tokens"] == 24
    assert p["acceptance"] == 0.5 and p["tokens_per_decode_step"] is not None
    assert sp.pooled(ms, 2, 64)["tokens_per_decode_step"] is None


def test_llama_cpp_drafts_by_the_engines_method():
    from pathlib import Path

    from scripts.benchmarks._speculative_peer import spec_args
    ngram, draft = spec_args(4), spec_args(3, Path("/x/d.gguf"))
    assert ngram[:2] == ["--spec-type", "ngram-simple"] and "--spec-draft-model" not in ngram
    assert draft[:2] == ["--spec-type", "draft-simple"]
    assert draft[draft.index("--spec-draft-model") + 1] == "/x/d.gguf"
    assert draft[draft.index("--spec-draft-n-max") + 1] == "3"


def test_the_table_names_the_method_that_drafted():
    from scripts.benchmarks._report_tables import speculative
    doc = {"results": {}, "workload": {"num_draft": 4}}
    assert "n-gram drafts" in speculative(doc)
    doc["workload"].update(speculative="draft:smollm2", gguf_type="F32")
    assert "draft model smollm2 for the model as F32" in speculative(doc)
