#!/usr/bin/env python
"""Where a step's time goes outside the model.

    scripts/bench overhead --json overhead.json
    scripts/bench overhead --quick            # fewer steps

1. The null model (`--model null`: no compute) through the whole group at 64 and 256
   running sequences (16-token prompts, long outputs, --max-seqs set to the count,
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
2. smol at 64 sequences: the group's step time against the worker's pure forward time on
   the same ForwardBatches, rebuilt from the step log and re-run offline on a ModelRunner
   (runner.execute alone): `step_over_forward_64`. This machine's speed drifts by 10-20%
   within minutes, more than the overhead being measured, so the same ratio is also taken
   within the run: against the worker's own time for each of those steps (from receiving
   the batch to the result, written by worker/process.py to the file TL_WORKER_TIMES
   names): `step_over_forward_in_run_64`. It hides what the core's concurrent work costs
   the forward (both share the cores) and shows what the worker waits for.

The groups run with overlapped scheduling (the default; `--no-overlap` measures without it,
`--compare` adds a run without it per case: `step_ms_null_N_no_overlap`,
`step_over_forward_64_no_overlap`). Overlapped, an engine step's work (plan N+1, settle N,
launch N+1) runs while the worker computes, and the log's duration_ms spans the next step's
plan, so the breakdown's parts no longer add up to the step: read step_ms.

Requests go through a raw DEALER socket with an unbounded receive queue (`sink`), not
the client library: at hundreds of thousands of deltas a second an asyncio client falls
behind, and the frontend's heartbeat then drops it (see the report of issue 6).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.benchmarks import _provenance as prov
from core import cli
from scripts.benchmarks import common as bl
from scripts.benchmarks._overhead_log import (arrival_spread, codec_ms, full_batch, log_step_ms,
                                              logging_inproc_ms, mean, null_execute_ms, replay,
                                              rows_of)

NULL_PROMPT = 16
WORKDIR: Path | None = None   # the runs' step logs, removed at the end unless --keep-logs
NULL_CONTEXT = 2048   # the null model's max_model_len


def parse(argv=None) -> argparse.Namespace:
    p = cli.parser(prog="scripts/bench overhead", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="64,256", help="running sequences for the null model")
    p.add_argument("--steps", type=int, default=1500, help="output tokens per null request")
    p.add_argument("--smol-seqs", type=int, default=64,
                   help="running sequences for the smol model")
    p.add_argument("--smol-steps", type=int, default=48, help="output tokens per smol request")
    p.add_argument("--skip-smol", action="store_true", help="measure the null model only")
    p.add_argument("--skip-null", action="store_true", help="measure the smol model only")
    p.add_argument("--quick", action="store_true", help="800 null steps, 24 smol steps")
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
        a.steps, a.smol_steps = 800, 24
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    top = NULL_CONTEXT - NULL_PROMPT - 1
    if not 50 <= a.steps <= top:
        p.error(f"--steps must be in [50, {top}] (the null model's context)")
    return a


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running a group

def sink(address: str, reqs, timeout: float = 300,
         bar: bl.Progress | None = None) -> tuple[float, int]:
    """Send every request at once on a raw DEALER and read every reply to the end:
    (wall seconds, output tokens). A measuring instrument, not the client library: its
    receive queue is unbounded (RCVHWM 0), so it never falls behind at the zmq level,
    and it does little per delta: it drains what has arrived after each poll and reads
    the frames as plain msgpack maps (the protocol's checked decode took 6.9 us a frame,
    this 2.0): on 2 cores, every cycle it spends is taken from the group it measures."""
    import msgpack
    import zmq

    from core.ipc.protocol import Delta, ErrorReply, Generate, encode
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        t0 = time.perf_counter()
        for i, r in enumerate(reqs):
            sock.send(encode(Generate(request_id=f"o{i}", prompt=r.prompt,
                                      max_tokens=r.max_tokens, ignore_eos=True)))
        left, tokens = len(reqs), 0
        unpack, recv, again = msgpack.unpackb, sock.recv, zmq.Again
        while left:
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError(f"no reply within {timeout}s; {left} requests unfinished")
            while left:
                try:
                    msg = unpack(recv(zmq.NOBLOCK))
                except again:
                    break
                if msg["t"] == ErrorReply.TAG:
                    raise RuntimeError(f"request {msg['request_id']}: {msg['code']}"
                                       f" {msg['message']}")
                if msg["t"] == Delta.TAG:
                    tokens += len(msg["token_ids"])
                    if msg["finish_reason"] is not None:
                        left -= 1
                        if bar is not None:
                            bar.tick()
        return time.perf_counter() - t0, tokens
    finally:
        sock.close()
        ctx.term()


@dataclass
class GroupRun:
    log: Path | None
    wall_s: float
    worker_times: Path | None = None


def run_group(args: list[str], reqs, log: bool, progress: bool, label: str,
              time_worker: bool = False) -> GroupRun:
    """A group on `args`: two short warm-up requests, then `reqs` through the sink.
    `time_worker`: the worker writes its time per batch to GroupRun.worker_times."""
    from scripts.group.harness import start_group
    from worker.process import TIMES_ENV
    tmp = Path(tempfile.mkdtemp(prefix="run-", dir=WORKDIR))
    times = tmp / "worker-times.txt" if time_worker else None
    g = start_group(tmp, args, log=log, env={TIMES_ENV: str(times)} if times else None)
    try:
        sink(g.address, [bl.Req(r.prompt, 4) for r in reqs[:2]])  # the first requests are slow
        wall, tokens = sink(g.address, reqs, bar=bl.Progress(len(reqs), label, progress))
    finally:
        g.stop()
    want = sum(r.max_tokens for r in reqs)
    if tokens != want:
        raise RuntimeError(f"got {tokens} output tokens, expected {want}")
    return GroupRun(g.log, wall, times)


def fixed_requests(n: int, prompt: int, steps: int, tokens: tuple[int, int]) -> list[bl.Req]:
    return bl.random_workload(n, 0, (prompt, prompt), (steps, steps), tokens)


# ---------------------------------------------------------------- 1. null model

def null_case(a, size: int, tokens) -> dict:
    reqs = fixed_requests(size, NULL_PROMPT, a.steps, tokens)
    blocks = size * (math.ceil((NULL_PROMPT + a.steps + 1) / 16) + 1)
    args = ["--model", "null", "--max-seqs", str(size), "--num-blocks", str(blocks),
            "--max-batch-tokens", str(max(2048, size))] + ([] if a.overlap else ["--no-overlap"])
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
            "logging_inproc_ms": logging_inproc_ms(on.log, batch, rep),
            "logging_e2e_ms": (on.wall_s - off.wall_s) * 1e3 / max(1, len(rows)),
            "wall_s_log": on.wall_s, "wall_s_no_log": off.wall_s,
            "codec_ms": codec, "serve_args": args, **no_overlap(a, args, reqs, f"null x{size}")}


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


# ---------------------------------------------------------------- report

def _f(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def null_table(size: str, b: dict) -> str:
    p, step = b["parts_ms"], b["step_ms"]
    share = lambda x: f"{100 * x / step:.0f}%" if step and not math.isnan(x) else ""  # noqa: E731
    rows = [("step (wall-time delta)", _f(step), "100%")]
    for label, key in (("engine: schedule, batch, on_step, hash", "engine"),
                       ("codec: ForwardBatch + StepResult", "codec_core_worker"),
                       ("worker: null execute", "null_execute"),
                       ("IPC transport (by subtraction)", "ipc_transport"),
                       ("between steps: publish, inputs", "between_steps"),
                       ("  of which StepEvents encode", "step_events_encode")):
        rows.append((label, _f(p[key]), share(p[key])))
    rows.append(("logging: writer work (in-process)", _f(b["logging_inproc_ms"]),
                 share(b["logging_inproc_ms"])))
    rows.append(("logging: log on - off (end to end)", _f(b["logging_e2e_ms"]),
                 share(b["logging_e2e_ms"])))
    if "step_ms_no_overlap" in b:
        rows.append(("step with --no-overlap", _f(b["step_ms_no_overlap"]), ""))
    title = f"null model, {b['batch']} running" + ("" if b["full_batch"] else f" (of {size})")
    return bl.table(rows, (title, "ms/step", "share"))


def smol_table(s: dict) -> str:
    return bl.table([("group step (wall-time delta)", _f(s["step_ms"])),
                     ("runner.execute alone (same batches)", _f(s["forward_ms"])),
                     ("engine work (replayed)", _f(s["engine_ms"])),
                     ("step / forward", _f(s["step_over_forward"])),
                     ("worker's forward in the run (same steps)", _f(s["forward_in_run_ms"])),
                     ("step / forward in the run", _f(s["step_over_forward_in_run"]))]
                    + [(f"{label} with --no-overlap", _f(s[key])) for label, key in (
                        ("step / forward", "step_over_forward_no_overlap"),
                        ("step / forward in the run", "step_over_forward_in_run_no_overlap"))
                       if key in s],
                    (f"smol, {s['batch']} running", "ms"))


def report(doc: dict) -> str:
    parts = [f"  null x{k}: error {b['error']}" if "error" in b else null_table(k, b)
             for k, b in doc["null"].items()]
    s = doc.get("smol")
    if s:
        parts.append(f"  smol: error {s['error']}" if "error" in s else smol_table(s))
    m = doc["machine"]
    parts.append(f"  {m['cores']} cores, load {m['load_avg_1m']:.1f}, {m['date']}")
    return "\n\n".join(parts)


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
    failed = [v for v in [*doc["null"].values(), doc.get("smol") or {}] if "error" in v]
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
