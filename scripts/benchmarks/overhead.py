#!/usr/bin/env python
"""Where a step's time goes outside the model.

    scripts/bench overhead --json overhead.json
    scripts/bench overhead --quick            # fewer steps

1. The null model (`--model null`: no compute) through the whole group at 64, 256 and
   1,024 running sequences (16-token prompts, long outputs, --max-seqs set to the count,
   blocks for all), so that steady steps are full decode batches. The step time is the
   mean wall-time delta between consecutive full-batch steps of the step log. It is
   broken down into: the engine (schedule + build the ForwardBatch + on_step + state
   hash; timed by replaying the log's steps in-process), the codec (msgpack encode and
   decode of the step's ForwardBatch and StepResult, and the encode of its StepEvents,
   timed in-process with core.ipc.protocol), the null worker's execute, the IPC transport
   (the rest of the core's plan -> commit window, i.e. the log's duration_ms, by
   subtraction) and what happens between steps (publishing the events, reading inputs).
   Logging: the writer's work per step, timed in-process (replaying the log with a real
   StepLog against without), and end to end (the same run with --no-log: the difference
   in wall time per step).
   Each process's CPU (utime + stime of /proc/PID/stat, its threads included, sampled
   20 times a second) over the steady steps (`cpu`): the core's and the worker's per
   step, the frontend's per delta it sent, the client's per delta it read, and each one's
   share of a core (`busy`): on this machine's 2 cores, a process near 1.0 is what bounds
   the step. `lag_s`: how long after the last step the last delta was read;
   `token_ms_at_client`: the run's wall time over the tokens of a request.
2. smol at 64 sequences: the group's step time against the worker's pure forward time on
   the same ForwardBatches, rebuilt from the step log and re-run offline on a ModelRunner
   (runner.execute alone): `step_over_forward_64`. This machine's speed drifts by 10-20%
   within minutes, more than the overhead being measured, so the same ratio is also taken
   within the run: against the worker's own time for each of those steps (from receiving
   the batch to the result, written by worker/process.py to the file TL_WORKER_TIMES
   names): `step_over_forward_in_run_64`. It hides what the core's concurrent work costs
   the forward (both share the cores) and shows what the worker waits for.

3. The client: the null model with `--client-streams` (1,000) requests, each a stream of
   one AsyncClient, all in flight (`asyncclient`): deltas read a second against those the
   group made, the client's CPU per delta, failed streams, and whether the frontend
   dropped the client.

The groups run with overlapped scheduling (the default; `--no-overlap` measures without it,
`--compare` adds a run without it per case: `step_ms_null_N_no_overlap`,
`step_over_forward_64_no_overlap`). Overlapped, an engine step's work (plan N+1, settle N,
launch N+1) runs while the worker computes, and the log's duration_ms spans the next step's
plan, so the breakdown's parts no longer add up to the step: read step_ms.

In 1 and 2 requests go through a raw DEALER socket with an unbounded receive queue
(`sink`), not the client library: at hundreds of thousands of deltas a second an asyncio
client falls behind, and the frontend's heartbeat then drops it (see the report of issue
6); 3 measures the client library itself.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl
from scripts.benchmarks._overhead_cpu import RECEIVED, Sampler, group_pids, per, split
from scripts.benchmarks._overhead_drive import Received, sink, streams
from scripts.benchmarks._overhead_log import (arrival_spread, codec_ms, full_batch, log_step_ms,
                                              logging_inproc_ms, mean, null_execute_ms, replay,
                                              rows_of, steady_window)
from scripts.benchmarks._overhead_text import report

NULL_PROMPT = 16
WORKDIR: Path | None = None   # the runs' step logs, removed at the end unless --keep-logs
NULL_CONTEXT = 2048   # the null model's max_model_len
DEFAULT_CLIENT_CAP = 1024   # the frontend's --max-inflight-per-client
CLIENT_GONE = "is gone: aborting"   # the frontend's line when it drops a client


def parse(argv=None) -> argparse.Namespace:
    p = cli.parser(prog="scripts/bench overhead", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="64,256,1024",
                   help="running sequences for the null model")
    p.add_argument("--steps", type=int, default=1500, help="output tokens per null request")
    p.add_argument("--smol-seqs", type=int, default=64,
                   help="running sequences for the smol model")
    p.add_argument("--smol-steps", type=int, default=48, help="output tokens per smol request")
    p.add_argument("--skip-smol", action="store_true", help="measure the null model only")
    p.add_argument("--skip-null", action="store_true", help="measure the smol model only")
    p.add_argument("--client-streams", type=int, default=1000,
                   help="null-model requests on one AsyncClient, all in flight (0: none)")
    p.add_argument("--quick", action="store_true",
                   help="400 null steps (the 1,024 case makes 400k deltas a run), 24 smol steps")
    p.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    prov.add_allow_dirty(p)
    p.add_argument("--keep-logs", action="store_true", help="keep the runs' step logs")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="measure the groups with --no-overlap (overlapped scheduling off)")
    p.add_argument("--compare", action="store_true",
                   help="also run each group with overlapped scheduling off (its step time"
                        " as *_no_overlap keys)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.smol_steps = 400, 24
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    top = NULL_CONTEXT - NULL_PROMPT - 1
    if not 50 <= a.steps <= top:
        p.error(f"--steps must be in [50, {top}] (the null model's context)")
    return a


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running a group

@dataclass
class GroupRun:
    log: Path | None
    wall_s: float
    worker_times: Path | None = None
    samples: list = field(default_factory=list)     # the CPU sampler's (_overhead_cpu.py)
    received: Received = field(default_factory=Received)
    dropped: bool = False     # the frontend logged this client gone


def run_group(args: list[str], reqs, log: bool, progress: bool, label: str,
              time_worker: bool = False, drive=sink, strict: bool = True) -> GroupRun:
    """A group on `args`: two short warm-up requests, then `reqs` through `drive` (sink or
    streams), each process's CPU sampled meanwhile. `time_worker`: the worker writes its
    time per batch to GroupRun.worker_times. `strict`: every output token must come."""
    from scripts.group.harness import start_group
    from worker.process import TIMES_ENV
    tmp = Path(tempfile.mkdtemp(prefix="run-", dir=WORKDIR))
    times = tmp / "worker-times.txt" if time_worker else None
    g = start_group(tmp, args, log=log, env={TIMES_ENV: str(times)} if times else None)
    got = Received()
    try:
        sink(g.address, [bl.Req(r.prompt, 4) for r in reqs[:2]])  # the first requests are slow
        sampler = Sampler({**group_pids(g), "client": os.getpid()},
                          {RECEIVED: lambda: got.deltas}).start()
        try:
            wall, tokens = drive(g.address, reqs, bar=bl.Progress(len(reqs), label, progress),
                                 received=got)
        finally:
            samples = sampler.stop()
    finally:
        g.stop()
    want = sum(r.max_tokens for r in reqs)
    if strict and tokens != want:
        raise RuntimeError(f"got {tokens} output tokens, expected {want}")
    return GroupRun(g.log, wall, times, samples, got, CLIENT_GONE in g.tail(10_000))


def fixed_requests(n: int, prompt: int, steps: int, tokens: tuple[int, int]) -> list[bl.Req]:
    return bl.random_workload(n, 0, (prompt, prompt), (steps, steps), tokens)


def null_args(a, size: int) -> list[str]:
    """--max-seqs `size` and blocks for all: every request runs at once."""
    blocks = size * (math.ceil((NULL_PROMPT + a.steps + 1) / 16) + 1)
    cap = ["--max-inflight-per-client", str(size)] if size > DEFAULT_CLIENT_CAP else []
    return (["--model", "null", "--max-seqs", str(size), "--num-blocks", str(blocks),
             "--max-batch-tokens", str(max(2048, size))] + cap
            + ([] if a.overlap else ["--no-overlap"]))


def cpu_figures(run: GroupRun, rows: list, batch: int, steps: int) -> dict:
    """Each process's CPU over the steady steps, how long after the last step the client
    read its last delta (the frontend's backlog, or the client's), and the run's wall time
    (first request sent to last delta read) over the tokens of each request: a token's
    time as the client sees it, which a frontend behind the core's steps makes longer than
    the step (nothing holds the core back for it)."""
    return {"cpu": split(run.samples, steady_window(rows, batch)),
            "lag_s": run.received.last_t - rows[-1].wall_time,
            "token_ms_at_client": run.wall_s * 1e3 / steps}


# ---------------------------------------------------------------- 1. null model

def null_case(a, size: int, tokens) -> dict:
    reqs = fixed_requests(size, NULL_PROMPT, a.steps, tokens)
    args = null_args(a, size)
    _say(f"== null model, {size} sequences, {a.steps} steps (step log on)")
    on = run_group(args, reqs, True, a.progress, f"null x{size}")
    _say(f"== null model, {size} sequences (--no-log)")
    off = run_group(args, reqs, False, a.progress, f"null x{size} no-log")
    rows = rows_of(on.log)
    batch = full_batch(rows)
    fig = log_step_ms(rows, batch)
    replay(on.log, batch)  # a first pass warms up
    rep = replay(on.log, batch)
    engine, codec = mean(rep.engine_ms), codec_ms(rep.batch, rep.events)
    wire = sum(codec[k] for k in ("forward_batch_encode", "forward_batch_decode",
                                  "step_result_encode", "step_result_decode"))
    null_ms = null_execute_ms(rep.batch)
    return {"step_ms": fig["step_ms"], "step_ms_p50": fig["step_ms_p50"],
            "batch": batch, "full_batch": batch == size, "steady_steps": fig["steady_steps"],
            "arrival_spread_steps": arrival_spread(on.log),
            "log_duration_ms": fig["duration_ms"],
            "engine_ms_p50": bl.percentile(rep.engine_ms, 50),
            "parts_ms": {"engine": engine, "codec_core_worker": wire,
                         "null_execute": null_ms,
                         "ipc_transport": fig["duration_ms"] - engine - wire - null_ms,
                         "between_steps": fig["step_ms"] - fig["duration_ms"],
                         "step_events_encode": codec["step_events_encode"]},
            **cpu_figures(on, rows, batch, a.steps),
            "logging_inproc_ms": logging_inproc_ms(on.log, batch, rep),
            "logging_e2e_ms": (on.wall_s - off.wall_s) * 1e3 / max(1, len(rows)),
            "wall_s_log": on.wall_s, "wall_s_no_log": off.wall_s,
            "codec_ms": codec, "serve_args": args, **no_overlap(a, args, reqs, f"null x{size}")}


def client_case(a, tokens) -> dict:
    """The null model with every request a stream of one AsyncClient, all in flight:
    whether the client library reads the deltas as fast as the group makes them, and its
    CPU per delta. Failed streams are a finding, not an error: the frontend drops a client
    whose connection looks dead (its heartbeat)."""
    n = a.client_streams
    reqs = fixed_requests(n, NULL_PROMPT, a.steps, tokens)
    args = null_args(a, n)
    _say(f"== null model, {n} streams on one AsyncClient")
    run = run_group(args, reqs, True, a.progress, f"AsyncClient x{n}", drive=streams,
                    strict=False)
    rows = rows_of(run.log)
    batch = full_batch(rows)
    fig = {**log_step_ms(rows, batch), **cpu_figures(run, rows, batch, a.steps)}
    c, errors = fig["cpu"], run.received.errors
    return {"streams": n, "step_ms": fig["step_ms"], "batch": batch, "full_batch": batch == n,
            "steady_steps": fig["steady_steps"], "cpu": c, "lag_s": fig["lag_s"],
            "token_ms_at_client": fig["token_ms_at_client"],
            "produced_deltas_per_s": per(c["deltas_produced"], c["window_s"]),
            "received_deltas_per_s": per(c["deltas_received"], c["window_s"]),
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "frontend_dropped_client": run.dropped, "wall_s": run.wall_s,
            "serve_args": args}


def no_overlap(a, args: list, reqs, label: str, time_worker: bool = False) -> dict:
    """--compare: the same group with overlapped scheduling off (log on): its step time,
    and with `time_worker` its step over the worker's time in the run."""
    if not a.compare or not a.overlap:
        return {}
    _say(f"== {label}, --no-overlap")
    run = run_group(args + ["--no-overlap"], reqs, True, a.progress, f"{label} no-overlap",
                    time_worker)
    rows = rows_of(run.log)
    fig = log_step_ms(rows, full_batch(rows), run.worker_times)
    out = {"step_ms_no_overlap": fig["step_ms"]}
    if "worker_ms" in fig:
        out["step_over_forward_in_run_no_overlap"] = fig["step_ms"] / fig["worker_ms"]
    return out


# ---------------------------------------------------------------- 2. smol

def smol_case(a, tokens) -> dict:
    from replay.logfile import LogFile
    from worker.load import make_runner

    n = a.smol_seqs
    reqs = fixed_requests(n, 32, a.smol_steps, tokens)
    blocks = n * (math.ceil((32 + a.smol_steps + 1) / 16) + 1)
    args = ["--model", "smol", "--max-seqs", str(n), "--num-blocks", str(blocks)] + (
        [] if a.overlap else ["--no-overlap"])
    _say(f"== smol, {n} sequences, {a.smol_steps} steps")
    run = run_group(args, reqs, True, a.progress, f"smol x{n}", time_worker=True)
    rows = rows_of(run.log)
    batch = full_batch(rows)
    fig = log_step_ms(rows, batch, run.worker_times)
    in_run = fig["worker_ms"]
    meta = LogFile(str(run.log)).meta
    _say("== smol: the same batches offline on a ModelRunner")
    runner = make_runner("smol", dtype=meta["dtype"], num_blocks=meta["num_blocks"],
                         block_size=meta["block_size"],
                         max_model_len=meta["model_info"]["max_model_len"])
    rep = replay(run.log, batch, runner)
    fwd = mean(rep.forward_ms)
    off = no_overlap(a, args, reqs, f"smol x{n}", time_worker=True)
    if off:
        off["step_over_forward_no_overlap"] = off["step_ms_no_overlap"] / fwd if fwd else None
    return {**off, "step_ms": fig["step_ms"], "log_duration_ms": fig["duration_ms"],
            "forward_ms": fwd, "engine_ms": mean(rep.engine_ms),
            "step_over_forward": fig["step_ms"] / fwd if fwd else float("nan"),
            "forward_in_run_ms": in_run, "step_over_forward_in_run": fig["step_ms"] / in_run,
            "batch": batch, "full_batch": batch == n, "steady_steps": fig["steady_steps"],
            "token_mismatch_steps": rep.mismatches, "serve_args": args}


# ---------------------------------------------------------------- main

def guarded(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # report it and go on
        import traceback
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    global WORKDIR
    a = parse(argv)
    start = prov.begin("overhead", a.json, a.allow_dirty)
    WORKDIR = Path(tempfile.mkdtemp(prefix="tl-bench-overhead-"))
    try:
        doc = measure(a)
    finally:
        if not a.keep_logs:
            import shutil
            shutil.rmtree(WORKDIR, ignore_errors=True)
    doc["logs"] = str(WORKDIR) if a.keep_logs else None
    print(report(doc))
    if a.json:
        models = [m for m, skip in (("null", a.skip_null), ("smol", a.skip_smol)) if not skip]
        bl.write_json(a.json, prov.stamp(doc, start, models))
    failed = [v for v in [*doc["null"].values(), doc.get("asyncclient") or {},
                          doc.get("smol") or {}] if "error" in v]
    return 1 if failed else 0


def measure(a) -> dict:
    doc: dict = {"null": {}, "null_steps": a.steps, "smol_steps": a.smol_steps,
                 "overlap": a.overlap}
    if not a.skip_null:
        facts = bl.model_facts("null")
        tokens = bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])
        for size in a.sizes:
            doc["null"][str(size)] = b = guarded(null_case, a, size, tokens)
            doc[f"step_ms_null_{size}"] = b.get("step_ms")
            if "step_ms_no_overlap" in b:
                doc[f"step_ms_null_{size}_no_overlap"] = b["step_ms_no_overlap"]
            doc[f"frontend_us_per_delta_null_{size}"] = (b.get("cpu") or {}).get(
                "frontend_us_per_delta")
        if a.client_streams:
            doc["asyncclient"] = c = guarded(client_case, a, tokens)
            n = a.client_streams
            doc[f"client_us_per_delta_{n}"] = (c.get("cpu") or {}).get("client_us_per_delta")
            doc[f"client_read_over_made_{n}"] = (c.get("cpu") or {}).get(
                "received_over_produced")
    if not a.skip_smol:
        facts = bl.model_facts("smol")
        tokens = bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])
        doc["smol"] = s = guarded(smol_case, a, tokens)
        doc[f"step_over_forward_{a.smol_seqs}"] = s.get("step_over_forward")
        doc[f"step_over_forward_in_run_{a.smol_seqs}"] = s.get("step_over_forward_in_run")
        for key in ("step_over_forward", "step_over_forward_in_run"):
            if f"{key}_no_overlap" in s:
                doc[f"{key}_{a.smol_seqs}_no_overlap"] = s[f"{key}_no_overlap"]
    doc["machine"] = bl.machine()
    return doc


if __name__ == "__main__":
    sys.exit(main())
