"""guidellm's benchmark against the gateway: its defaults (/v1/chat/completions, streamed,
synthetic prompts counted with a local tokenizer), a constant rate for a fixed time, the
report written as JSON and read back here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scripts.evaltools.toolenv import GUIDELLM, bin_dir, run_logged


class GuidellmFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Load:
    seconds: int = 20
    rate: float = 1.0             # requests per second, constant
    prompt_tokens: int = 32
    output_tokens: int = 8
    worker_processes: int = 1     # guidellm's request processes (its default: 10)


@dataclass(frozen=True)
class Summary:
    requests: int                 # successful + incomplete (cut off at the end) + errored
    successful: int
    errored: int
    incomplete: int
    streamed: int                 # requests that received at least one token (any status)
    first_error: str | None       # the first errored request's message, when any


def run(http: str, tokenizer: Path, out: Path, load: Load = Load(),
        timeout: float = 600) -> Path:
    """`guidellm run` against `http` (the gateway's base URL); returns the JSON report."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "guidellm.json"
    cmd = [str(bin_dir(GUIDELLM) / "guidellm"), "run",
           "--backend", f"kind=openai_http,target={http}",
           "--profile", f"kind=constant,rate={load.rate}",
           "--constraint", f"kind=max_duration,seconds={load.seconds}",
           "--data", f"kind=synthetic_text,prompt_tokens={load.prompt_tokens},"
                     f"output_tokens={load.output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--output", f"kind=json,path={report}", "--disable-console-interactive"]
    # one worker process, not guidellm's 10: each imports torch at the benchmark's start,
    # and on 2 cores they took the engine's CPU (its steps went from ~1 s to ~8 s here)
    run_logged(cmd, out, out, "guidellm", timeout, GuidellmFailed,
               {"GUIDELLM__MAX_WORKER_PROCESSES": str(load.worker_processes)})
    if not report.is_file():
        raise GuidellmFailed(f"guidellm wrote no report; see {out / 'guidellm.log'}")
    return report


def save_tokenizer(gguf: Path, out: Path) -> Path:
    """The GGUF's tokenizer as a directory (guidellm counts its synthetic prompts' tokens)."""
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def summary(report: Path) -> Summary:
    """The one benchmark's request counts (a constant profile runs one), as its console
    table shows them (scheduler_metrics.requests_made counts more: requests queued ahead)."""
    benchmarks = json.loads(report.read_text())["benchmarks"]
    if len(benchmarks) != 1:
        raise GuidellmFailed(f"{report} holds {len(benchmarks)} benchmarks, not 1")
    b = benchmarks[0]
    n = b["metrics"]["request_totals"]
    errored = b["requests"].get("errored") or []
    first = next((r.get("info", {}).get("error") for r in errored), None)
    sampled = [r for rows in b["requests"].values() for r in rows or []]
    streamed = sum(1 for r in sampled if r.get("info", {}).get("timings", {}).get(
        "first_token_iteration") is not None)
    return Summary(n["total"], n["successful"], n["errored"], n["incomplete"], streamed, first)
