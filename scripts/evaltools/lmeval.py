"""lm-evaluation-harness over the project's own tasks (tasks/: YAMLs and the jsonl they read).

lm-eval runs in its tool venv (toolenv.py) with tasks/ as its working directory (the YAMLs'
data_files are relative), offline, with `--log_samples`; the results and each sample are read
back from its output folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from scripts.evaltools.toolenv import LM_EVAL, bin_dir, run_logged

TASKS = Path(__file__).resolve().parent / "tasks"
GENERATE = "tl_gen_qa"        # generate_until: arithmetic and capital cities
CHOICE = "tl_mc_facts"        # multiple_choice: 4-choice facts, by loglikelihood


class LmEvalFailed(RuntimeError):
    pass


def gateway_args(http: str, model: str = "tl", tokenizer: Path | None = None) -> dict:
    """local-completions against the gateway: the gateway's tokenizer (/tokenizer_info,
    /tokenize) unless `tokenizer` names a local one."""
    args = {"model": model, "base_url": f"{http}/v1/completions", "num_concurrent": 1,
            "max_retries": 1}
    return args | ({"tokenizer": str(tokenizer)} if tokenizer else {})


def hf_args(pretrained: Path, gguf_file: str | None = None) -> dict:
    """lm-eval's own `hf` model on the same weights, fp32 on CPU (as the engine runs them)."""
    args = {"pretrained": str(pretrained), "dtype": "float32"}   # cpu: the torch is CPU-only
    return args | ({"gguf_file": gguf_file} if gguf_file else {})


def run(model: str, model_args: dict, tasks: list[str], out: Path, batch_size: int = 4,
        timeout: float = 1800) -> Path:
    """`lm_eval --model MODEL ... --log_samples --output_path out`; returns out."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(bin_dir(LM_EVAL) / "lm_eval"), "--model", model,
           "--model_args", ",".join(f"{k}={v}" for k, v in model_args.items()),
           "--tasks", ",".join(tasks), "--include_path", str(TASKS),
           "--batch_size", str(batch_size), "--log_samples", "--output_path", str(out)]
    run_logged(cmd, TASKS, out, "lm_eval", timeout, LmEvalFailed)
    return out


def results(out: Path) -> dict:
    """The run's results per task: {task: {"acc,none": ..., ...}}."""
    files = sorted(out.rglob("results_*.json"))
    if not files:
        raise LmEvalFailed(f"lm_eval wrote no results under {out}")
    return json.loads(files[-1].read_text())["results"]


def samples(out: Path, task: str) -> list[dict]:
    """The task's logged samples, by doc_id."""
    files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    if not files:
        raise LmEvalFailed(f"lm_eval logged no samples of {task} under {out}")
    rows = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["doc_id"])


def loglikelihoods(rows: list[dict]) -> list[list[float]]:
    """Each multiple-choice sample's loglikelihood of each choice."""
    return [[float(r[0]) for r in row["filtered_resps"]] for row in rows]


def picks(rows: list[dict]) -> list[int]:
    """The choice each multiple-choice sample picked (the argmax, as lm-eval's acc takes it)."""
    return [max(range(len(ll)), key=ll.__getitem__) for ll in loglikelihoods(rows)]
