"""scripts/replay whatif / trace: a recorded run re-scheduled under another configuration,
and a log's traffic as a CSV trace (docs/design/whatif.md, "What-if replay").

Exit codes as for every replay command: 0 done, 2 a log or trace that cannot be used (one
line on stderr saying why: damaged, too few steps to fit, a bad CSV or configuration).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from core import cli
from replay.logfile import LogFile
from replay.runmetrics import by_priority, metrics
from replay.simulate import KNOBS, Knobs, Simulated, scheduler_for, simulate
from replay.stepmodel import StepModel, fit
from replay.timeline import Recorded, recorded
from replay.trace import TraceError, from_log, read_csv, scaled, write_csv

ROWS = ("throughput_tok_s", "makespan_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
        "tpot_ms_p99", "queue_ms_p50", "queue_ms_p99", "preemptions", "steps", "draft_tokens",
        "accepted_tokens", "acceptance")
PRIORITY_ROWS = ROWS[2:8]   # the latencies


def add_parsers(sub) -> None:
    w = cli.command(sub, "whatif", "predict the log's traffic under another configuration")
    w.add_argument("file", nargs="?", help="the step log (or --trace with --step-model)")
    w.add_argument("--policy", choices=["fcfs", "priority"],
                   help="the order of admission and preemption (default: the log's)")
    for name, what in (("aging-steps", "steps per priority level of aging"),
                       ("max-seqs", "requests running at once"),
                       ("max-batch-tokens", "tokens in one step"),
                       ("num-blocks", "KV blocks in the pool"),
                       ("max-chunk", "prompt tokens of one chunk"),
                       ("preempt-margin", "priority levels for a waiting request to preempt")):
        w.add_argument(f"--{name}", type=int, help=f"{what} (default: the log's)")
    w.add_argument("--prefill", choices=["whole", "chunked"],
                   help="prefill policy (default: the log's)")
    w.add_argument("--speculative", metavar="ngram|off",
                   help="speculative decoding with n-gram drafts, or none (default: the"
                        " log's); needs a log from the batch-invariant mode")
    w.add_argument("--num-draft", type=int,
                   help="with speculation, the most drafts per request and step (default:"
                        " the log's, else 4)")
    w.add_argument("--spec-max-batch", type=int,
                   help="with speculation, a step drafts only while at most this many"
                        " requests run (default: the log's)")
    w.add_argument("--load", type=float, default=1.0, help="arrival rate factor (2.0: twice)")
    w.add_argument("--json", help="write recorded, predicted and fit here")
    w.add_argument("--plot", help="draw the predicted timeline beside the recorded one")
    w.add_argument("--fit", action="store_true", help="print the step-time model only")
    w.add_argument("--trace", help="a CSV trace (scripts/replay trace) to simulate instead")
    w.add_argument("--step-model", help="with --trace: the log to fit the step-time model on")
    w.set_defaults(fn=cmd_whatif)
    t = cli.command(sub, "trace", "the log's traffic as a CSV of arrival_s,prompt_tokens,"
                                  "output_tokens,priority")
    t.add_argument("file", help="the step log")
    t.add_argument("-o", "--output", required=True, help="the CSV file")
    t.set_defaults(fn=cmd_trace)


def cmd_trace(a) -> int:
    try:
        log = LogFile(a.file)
        reqs = from_log(log, recorded(log))
        write_csv(reqs, a.output)
    except (TraceError, OSError) as e:
        return _refuse(e)
    print(f"wrote {a.output}: {len(reqs)} requests")
    return 0


def cmd_whatif(a) -> int:
    try:
        return _whatif(a)
    except (TraceError, OSError) as e:
        return _refuse(e)


def _refuse(e: Exception) -> int:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


@dataclass
class WhatIf:
    doc: dict              # the pinned JSON: recorded, predicted, fit
    model: StepModel
    recorded: Recorded     # the log the model was fitted on
    simulated: Simulated
    arrivals: dict[int, float]   # the simulated arrivals (s), by request id
    detail: dict           # {"recorded", "predicted"}: runmetrics.by_priority of each (or None)


def recorded_figures(log: LogFile, rec: Recorded | None = None, detail: bool = False):
    """The log's own figures, computed as a prediction's are (with detail: and each
    priority's, as a pair)."""
    rec = rec or recorded(log)
    reqs = from_log(log, rec)
    args = (rec.steps, {r.id: r.arrival_s for r in reqs}, {r.id: r.priority for r in reqs})
    return (metrics(*args), by_priority(*args)) if detail else metrics(*args)


def predict(log: LogFile, knobs: Knobs = Knobs(), load: float = 1.0,
            trace: str | None = None) -> WhatIf:
    """The log's traffic (or the CSV trace's) under the log's configuration changed by
    `knobs`, its arrivals compressed by `load`, timed by a model fitted on the log."""
    rec = recorded(log)
    model = fit(rec.steps, log.path)
    reqs = read_csv(trace) if trace else from_log(log, rec)
    before, before_p = (None, None) if trace else recorded_figures(log, rec, detail=True)
    if load != 1.0:
        reqs = scaled(reqs, load)
    sched = scheduler_for(log.meta, knobs, tokens=not trace)
    # a speculating core runs without overlap (core/config.py CoreConfig.overlapped)
    sim = simulate(sched, reqs, model,
                   overlap=bool(log.meta.get("overlap")) and not sched.cfg.num_draft)
    args = (sim.steps, {r.id: r.arrival_s for r in reqs}, {r.id: r.priority for r in reqs})
    doc = {"recorded": before, "predicted": metrics(*args),
           "fit": {"r2": round(model.r2, 6), "mape": round(model.mape, 6)}}
    return WhatIf(doc, model, rec, sim, args[1],
                  {"recorded": before_p, "predicted": by_priority(*args)})


def _whatif(a) -> int:
    if bool(a.trace) == bool(a.file) or bool(a.trace) != bool(a.step_model):
        raise TraceError("give a LOG, or --trace CSV with --step-model LOG")
    log = LogFile(a.step_model or a.file)
    if a.fit:
        print(fit(recorded(log).steps, log.path).describe())
        return 0
    knobs = Knobs(**{k: getattr(a, k) for k in KNOBS})
    w = predict(log, knobs, a.load, a.trace)
    print(report(w, knobs, a.load))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(w.doc, f, indent=2)
    if a.plot:
        from replay.whatif_plot import plot_whatif
        runs = [] if a.trace else [("recorded", w.recorded.steps, w.recorded.arrivals)]
        plot_whatif(runs + [("predicted", w.simulated.steps, w.arrivals)], a.plot)
        print(f"wrote {a.plot}")
    return 0


def report(w: WhatIf, knobs: Knobs, load: float) -> str:
    changed = {k: v for k, v in asdict(knobs).items() if v is not None}
    what = ", ".join(f"{k} {v}" for k, v in changed.items()) or "the recorded configuration"
    lines = [f"what-if: {what}" + (f", load x{load:g}" if load != 1.0 else ""),
             w.model.describe().splitlines()[0]]
    if w.doc["predicted"]["draft_tokens"] and not w.model.verify_steps:
        lines.append("verified decodes: each row costs a decode row's (the log has none to fit"
                     " verify_rows on)")
    refused = w.simulated.refused
    if refused:
        lines.append(f"refused by the scheduler: {len(refused)} request(s), e.g. request"
                     f" {refused[0][0]}: {refused[0][1]}")
    rec, pred = w.doc["recorded"] or {}, w.doc["predicted"]
    lines.append(f"{'':<18}{'recorded':>12}{'predicted':>12}{'change':>9}")
    lines += [_row(key, rec.get(key), pred[key]) for key in ROWS]
    rec_p = w.detail["recorded"] or {}
    for p, figs in w.detail["predicted"].items():
        lines.append(f"priority {p} (n {pred['by_priority'][p]['n']}):")
        lines += [_row(f"  {key}", rec_p.get(p, {}).get(key), figs[key])
                  for key in PRIORITY_ROWS]
    return "\n".join(lines)


def _row(name: str, a, b) -> str:
    show = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
    change = f"{(b - a) / a * 100:+.1f}%" if a and b is not None else ""
    return f"{name:<18}{show(a):>12}{show(b):>12}{change:>9}"
