"""The real eval and load tools against the gateway on smollm2 (slow: each tool is installed
on first use into a venv of its own in the cache, scripts/evaltools/toolenv.py).

- lm-evaluation-harness: `local-completions` (batches of 4 prompts) runs the project's
  generate_until and multiple-choice tasks (scripts/evaltools/tasks/); the multiple-choice
  picks equal, item by item, those of lm-eval's own `hf` model on the same GGUF, which
  transformers dequantizes itself.
- guidellm: its default benchmark (chat completions, streamed, synthetic prompts) at a
  constant rate for 20 s ends with no errored request.

The pure parts (the task data, reading lm-eval's samples and guidellm's report) run in the
default suite."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts.evaltools import guidellm, lmeval
from scripts.evaltools.toolenv import GUIDELLM, LM_EVAL, Tool, ToolInstallFailed, bin_dir

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]
# One torch thread: the tools' processes share the 2 cores with the group, and a worker whose
# second thread is descheduled waits a time slice at every parallel region (~300 a forward):
# smollm2's steps took ~2 s at load 8 with 2 threads, ~0.12 s with one
GROUP_ENV = {"OMP_NUM_THREADS": "1"}


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (lmeval.TASKS / name).read_text().splitlines()]


def test_task_data_is_big_enough_and_well_formed():
    gen, mc = _jsonl("gen_qa.jsonl"), _jsonl("mc_facts.jsonl")
    assert len(gen) >= 50 and len(mc) >= 50
    assert all(set(r) == {"question", "answer"} and r["answer"].strip() for r in gen)
    for r in mc:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4, r
        assert r["answer"] in range(4), r
    assert len({r["question"] for r in gen}) == len(gen)
    assert len({r["question"] for r in mc}) == len(mc)


def test_picks_are_the_argmax_first_on_ties():
    rows = [{"filtered_resps": [["-3.5", "False"], ["-1.25", "True"], ["-2", "False"]]},
            {"filtered_resps": [["-1", "False"], ["-1", "False"]]}]
    assert lmeval.picks(rows) == [1, 0]


def test_guidellm_summary_reads_counts_and_the_first_error(tmp_path):
    report = tmp_path / "r.json"
    made = {"successful": 7, "errored": 2, "incomplete": 1, "total": 10}
    errored = [{"info": {"error": "400 Bad Request"}}, {"info": {"error": "later"}}]
    token = {"info": {"timings": {"first_token_iteration": 1.5}}}
    report.write_text(json.dumps({"benchmarks": [
        {"metrics": {"request_totals": made},
         "requests": {"successful": [token], "errored": errored,
                      "incomplete": [token, {"info": {"timings": {}}}]}}]}))
    s = guidellm.summary(report)
    assert (s.requests, s.successful, s.errored, s.incomplete) == (10, 7, 2, 1)
    assert s.streamed == 2
    assert s.first_error == "400 Bad Request"


@pytest.fixture(scope="module")
def tools():
    """Both tools installed (in parallel: mostly downloads); a failed install fails."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(bin_dir, t) for t in (LM_EVAL, GUIDELLM)]
        try:
            return [f.result() for f in futures]
        except ToolInstallFailed as e:
            pytest.fail(str(e))


@pytest.fixture(scope="module")
def gguf() -> Path:
    from worker.registry_models import gguf_path
    return gguf_path("smollm2")


@pytest.mark.slow
def test_a_failed_install_says_what_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    with pytest.raises(ToolInstallFailed, match=r"installing guidellm==0\.0\.0\.dev0 failed"):
        bin_dir(Tool("guidellm", "0.0.0.dev0"))
    assert not list(tmp_path.rglob(".ready"))


@pytest.mark.slow
@pytest.mark.tool_venvs(LM_EVAL, GUIDELLM)
def test_lm_eval_through_the_gateway_picks_what_hf_picks(tools, group, gguf, tmp_path):
    gw = lmeval.run("local-completions", lmeval.gateway_args(group.http),
                    [lmeval.GENERATE, lmeval.CHOICE], tmp_path / "gateway", batch_size=4)
    hf = lmeval.run("hf", lmeval.hf_args(gguf.parent, gguf.name), [lmeval.CHOICE],
                    tmp_path / "hf", batch_size=4)
    gw_res, hf_res = lmeval.results(gw), lmeval.results(hf)
    gw_mc, hf_mc = lmeval.samples(gw, lmeval.CHOICE), lmeval.samples(hf, lmeval.CHOICE)
    gen = lmeval.samples(gw, lmeval.GENERATE)
    print(f"\nmultiple choice acc: gateway {gw_res[lmeval.CHOICE]['acc,none']:.4f}, "
          f"hf {hf_res[lmeval.CHOICE]['acc,none']:.4f} ({len(gw_mc)} items); "
          f"generate_until exact_match: gateway "
          f"{gw_res[lmeval.GENERATE]['exact_match,strip']:.4f} ({len(gen)} items)")
    assert len(gw_mc) == len(hf_mc) == len(_jsonl("mc_facts.jsonl"))
    assert len(gen) == len(_jsonl("gen_qa.jsonl"))
    differ = [(r["doc_id"], a, b) for r, a, b in
              zip(gw_mc, lmeval.picks(gw_mc), lmeval.picks(hf_mc)) if a != b]
    assert not differ, f"items whose pick differs (doc_id, gateway, hf): {differ}"
    assert gw_res[lmeval.CHOICE]["acc,none"] == hf_res[lmeval.CHOICE]["acc,none"]
    # the loglikelihoods themselves agree (fp32 both sides, other kernels: ~5e-5 apart)
    worst = max(abs(a - b) for x, y in zip(lmeval.loglikelihoods(gw_mc),
                                           lmeval.loglikelihoods(hf_mc)) for a, b in zip(x, y))
    assert worst < 1e-3, worst
    # generation works: the answers are the model's (hf scores 0.65 here), not noise
    assert gw_res[lmeval.GENERATE]["exact_match,strip"] > 0.3


@pytest.mark.slow
@pytest.mark.tool_venvs(LM_EVAL, GUIDELLM)
def test_guidellm_constant_rate_ends_without_errors(tools, group, gguf, tmp_path):
    tok = guidellm.save_tokenizer(gguf, tmp_path / "tokenizer")
    load = guidellm.Load(seconds=12)   # 12 requests at 1/s: the tool's path end to end
    s = guidellm.summary(guidellm.run(group.http, tok, tmp_path / "guidellm", load))
    print(f"\nguidellm: {s}")
    assert s.errored == 0, s.first_error
    assert s.requests > 0
    # none finished in 12 s: `streamed` tells a hang (0) from a crawl (decode steps of seconds
    # on a machine loaded by other work)
    assert s.successful > 0, f"no request finished in {load.seconds} s: {s}"
