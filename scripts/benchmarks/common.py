"""What the benchmark scripts share: workloads, driving a group through AsyncClient,
latency statistics, a progress bar, machine facts and tables.

A workload is a list of `Req` (token-id prompt, max_tokens, arrival offset in seconds);
every random choice comes from `random.Random(seed)`, so a workload is the same on every
machine. Imports no torch or transformers.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from replay.progress import Progress  # noqa: F401 (bl.Progress: the benchmarks' bar)
from replay.runmetrics import percentile
from scripts import ROOT



# ---------------------------------------------------------------- workloads

@dataclass
class Req:
    prompt: list[int]
    max_tokens: int
    arrival: float = 0.0          # seconds after the run starts
    options: dict = field(default_factory=dict)   # this request's own stream() keywords


def parse_range(text: str) -> tuple[int, int]:
    """"16-512" -> (16, 512); "64" -> (64, 64)."""
    lo, _, hi = str(text).partition("-")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise ValueError(f"bad range {text!r}: want LO-HI with 1 <= LO <= HI")
    return lo, hi


def safe_token_range(vocab_size: int, eos_ids) -> tuple[int, int]:
    """[lo, hi): the larger id range on either side of the EOS/special ids."""
    eos = sorted(eos_ids) or [0]
    below, above = (0, eos[0]), (eos[-1] + 1, vocab_size)
    lo, hi = max((below, above), key=lambda r: r[1] - r[0])
    if hi - lo < 2:
        raise ValueError(f"no safe token range in a vocabulary of {vocab_size}")
    return lo, hi


def random_workload(n: int, seed: int, prompt_len: tuple[int, int],
                    output_len: tuple[int, int], tokens: tuple[int, int]) -> list[Req]:
    """n requests: lengths uniform in the given ranges, prompt ids uniform in [lo, hi)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.randint(*prompt_len)
        o = rng.randint(*output_len)
        out.append(Req([rng.randrange(*tokens) for _ in range(p)], o))
    return out


MIXED = {"name": "mixed", "seed": 0, "prompt_len": [16, 512], "output_len": [16, 256],
         "arrivals": "all at t=0", "sampling": "greedy", "ignore_eos": True}


def mixed_workload(n: int, tokens: tuple[int, int]) -> list[Req]:
    """The comparison workload "mixed" (see MIXED)."""
    return random_workload(n, MIXED["seed"], tuple(MIXED["prompt_len"]),
                           tuple(MIXED["output_len"]), tokens)


def file_workload(path: str, seed: int, tokens: tuple[int, int]) -> list[Req]:
    """A JSON list of {"prompt": [ids]} or {"prompt_len": N}, each with "max_tokens";
    optional "arrival" (seconds). Random ids fill prompts given by length."""
    rng = random.Random(seed)
    items = json.loads(Path(path).read_text())
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty JSON list of requests")
    out = []
    for i, it in enumerate(items):
        prompt = it.get("prompt")
        if prompt is None:
            prompt = [rng.randrange(*tokens) for _ in range(int(it["prompt_len"]))]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise ValueError(f"{path}: request {i}: prompt must be a non-empty list of ids")
        out.append(Req(prompt, int(it["max_tokens"]), float(it.get("arrival", 0.0))))
    return out


def poisson_arrivals(reqs: list[Req], rate: float, seed: int) -> None:
    """Give the requests Poisson arrivals at `rate` per second (in place, in order)."""
    rng = random.Random(f"arrivals:{seed}")
    t = 0.0
    for r in reqs:
        r.arrival = t
        t += rng.expovariate(rate)


def describe(reqs: list[Req]) -> dict:
    p = [len(r.prompt) for r in reqs]
    o = [r.max_tokens for r in reqs]
    return {"requests": len(reqs), "prompt_tokens": sum(p), "max_output_tokens": sum(o),
            "prompt_len_mean": sum(p) / len(p), "output_len_mean": sum(o) / len(o),
            "last_arrival_s": max(r.arrival for r in reqs)}


# ---------------------------------------------------------------- statistics

def summarize(values: list[float]) -> dict:
    """mean, p50, p90, p99 (nan, and None, for no values)."""
    mean = sum(values) / len(values) if values else float("nan")
    return {"mean": mean, "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "n": len(values)}


def json_safe(obj):
    """nan/inf -> None, recursively, so that the JSON file is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str, doc: dict) -> None:
    Path(path).write_text(json.dumps(json_safe(doc), indent=2) + "\n")


# ---------------------------------------------------------------- driving a group

def add_run_options(p) -> None:
    """--timeout, --json, --allow-dirty and --no-progress: what a benchmark driving a group
    through AsyncClient takes."""
    from scripts.benchmarks import _provenance as prov
    p.add_argument("--timeout", type=float, default=1800, help="client timeout, seconds")
    p.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(p)
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")


@dataclass
class Trace:
    """One request as the client saw it (perf_counter seconds)."""
    sent: float
    deltas: list[tuple[float, int]] = field(default_factory=list)   # (time, tokens in delta)
    tokens: list[int] = field(default_factory=list)
    end: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    # the stream counted more tokens than it carried ids for (llama-server holds back an id
    # whose text ends inside a UTF-8 sequence): every token counts, the ids are not compared
    ids_partial: bool = False

    def count(self) -> int:
        """Tokens generated, as the stream counted them (the deltas' sizes)."""
        return sum(n for _, n in self.deltas)

    def ttft(self) -> float | None:
        return self.deltas[0][0] - self.sent if self.deltas else None

    def tpot(self) -> float | None:
        n = self.count()
        return (self.deltas[-1][0] - self.deltas[0][0]) / (n - 1) if n > 1 else None

    def itl(self) -> list[float]:
        """Gaps between deltas; a delta of k tokens counts as k gaps of gap/k."""
        out = []
        for (t0, _), (t1, k) in zip(self.deltas, self.deltas[1:]):
            out += [(t1 - t0) / k] * k
        return out


async def _one(client, req: Req, t0: float, opts: dict, bar: Progress,
               gate: asyncio.Semaphore | None) -> Trace:
    delay = t0 + req.arrival - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if gate is None:
        return await _sent(client, req, opts, bar)
    async with gate:   # the request is sent (and its TTFT starts) once it holds a place
        return await _sent(client, req, opts, bar)


async def _sent(client, req: Req, opts: dict, bar: Progress) -> Trace:
    tr = Trace(time.perf_counter())
    try:
        async for d in client.stream(req.prompt, max_tokens=req.max_tokens,
                                     **{**opts, **req.options}):
            if d.token_ids:
                tr.deltas.append((time.perf_counter(), len(d.token_ids)))
                tr.tokens.extend(d.token_ids)
            if d.finish_reason is not None:
                tr.finish_reason = d.finish_reason
    except Exception as e:  # a refused or failed request is counted, not fatal
        tr.error = f"{type(e).__name__}: {e}"
    tr.end = time.perf_counter()
    bar.tick()
    return tr


@dataclass
class RunResult:
    traces: list[Trace]
    wall: float
    stats_before: dict
    stats_after: dict


async def drive(address: str, reqs: list[Req], *, timeout: float = 600, progress: bool = True,
                label: str = "requests", concurrency: int | None = None, **opts) -> RunResult:
    """Send every request at its arrival offset and stream it to the end (one AsyncClient);
    with `concurrency`, at most that many are in flight (the others wait their turn).

    `opts` go to AsyncClient.stream (temperature, ignore_eos, priority, ...)."""
    from frontend.client import AsyncClient

    async with AsyncClient(address, timeout=timeout) as c:
        before = await c.stats()
        bar = Progress(len(reqs), label, progress)
        t0 = time.perf_counter()
        gate = asyncio.Semaphore(concurrency) if concurrency else None
        traces = await asyncio.gather(*(_one(c, r, t0, opts, bar, gate) for r in reqs))
        wall = max((t.end for t in traces), default=t0) - t0
        after = await c.stats()
    return RunResult(list(traces), wall, before, after)


def metrics(run: RunResult) -> dict:
    """Throughput and latency figures of a run (latencies in milliseconds)."""
    ok = [t for t in run.traces if t.error is None]
    out_tokens = sum(t.count() for t in ok)
    ms = lambda xs: [x * 1e3 for x in xs if x is not None]  # noqa: E731
    b, a = run.stats_before, run.stats_after
    return {"requests": len(run.traces), "completed": len(ok),
            "errors": len(run.traces) - len(ok),
            "first_errors": [t.error for t in run.traces if t.error][:5],
            "ids_partial": sum(t.ids_partial for t in run.traces),
            "output_tokens": out_tokens, "wall_s": run.wall,
            "output_tok_s": out_tokens / run.wall if run.wall > 0 else float("nan"),
            "requests_s": len(ok) / run.wall if run.wall > 0 else float("nan"),
            "ttft_ms": summarize(ms(t.ttft() for t in ok)),
            "tpot_ms": summarize(ms(t.tpot() for t in ok)),
            "itl_ms": summarize(ms(x for t in ok for x in t.itl())),
            "e2e_ms": summarize(ms(t.end - t.sent for t in ok)),
            "preemptions": a.get("preemptions", 0) - b.get("preemptions", 0),
            "steps": a.get("steps", 0) - b.get("steps", 0)}


# ---------------------------------------------------------------- models and machine

def model_facts(model: str) -> dict:
    """vocab_size, eos_ids and the checkpoint dir of a preset or local HF directory,
    read from its config.json (no torch). `null` shares tiny's vocabulary."""
    from worker.load import resolve_model

    path = resolve_model("tiny" if model == "null" else model)
    cfg = json.loads((path / "config.json").read_text())
    eos = cfg.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return {"vocab_size": cfg["vocab_size"], "eos_ids": eos, "path": str(path)}


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=ROOT, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=ROOT, timeout=5).stdout
        return (out.stdout.strip() + ("+dirty" if dirty.strip() else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    import platform
    return {"cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "platform": platform.platform(), "python": platform.python_version(),
            **cpu(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": git_commit()}


def cpu() -> dict:
    """The CPU's model and widest vector extension: figures from an AVX2 machine and an
    AVX-512 one do not compare (the panel kernel runs only on the latter)."""
    from worker.native import cpu_flags
    flags = set(cpu_flags().split())
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    widest = next((v for v in ("avx512f", "avx2", "avx") if v in flags), "")
    return {"cpu": model, "cpu_vectors": widest}


# ---------------------------------------------------------------- output

def table(rows: list[tuple], header: tuple | None = None) -> str:
    """Left-aligned first column, right-aligned others."""
    rows = [tuple(str(c) for c in r) for r in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    lines = []
    for j, r in enumerate(rows):
        cells = [c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)]
        lines.append("  " + "  ".join(cells))
        if header and j == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def latency_rows(m: dict) -> list[tuple]:
    return [(name, *(_ms(m[key][k]) for k in ("mean", "p50", "p90", "p99")))
            for name, key in (("TTFT ms", "ttft_ms"), ("TPOT ms", "tpot_ms"),
                              ("ITL ms", "itl_ms"), ("E2E ms", "e2e_ms"))]
