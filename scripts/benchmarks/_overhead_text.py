"""scripts/bench overhead's report on the terminal: each case's tables from its figures
(pure: a document in, text out)."""
from __future__ import annotations

import math

from scripts.benchmarks import common as bl


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


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
    return "\n\n".join([bl.table(rows, (title, "ms/step", "share")),
                        cpu_table(b, "client: the raw sink")])


def cpu_table(case: dict, client: str) -> str:
    """Each process's CPU over the steady steps, and whether the client kept up."""
    c = case["cpu"]
    busy, run = c["busy"], c["run"]
    rows = [(name, _f(c[f"{key}_ms_per_step"]), _f(c.get(f"{key}_us_per_delta"), ".1f"),
             _f(busy[key], ".2f"))
            for name, key in (("core", "core"), ("worker", "worker"),
                              ("frontend", "frontend"), (client, "client"))]
    text = bl.table(rows, ("CPU over the steady steps", "ms/step", "us/delta",
                           "busy (cores)"))
    return (f"{text}\n  deltas read / made in the window: {_f(c['received_over_produced'])};"
            f" the last delta {_f(case['lag_s'], '.2f')} s after the last step; a token at"
            f" the client every {_f(case['token_ms_at_client'])} ms\n  over the whole run"
            f" (first request to last delta), us/delta: frontend"
            f" {_f(run['frontend_us_per_delta'], '.1f')}, client"
            f" {_f(run['client_us_per_delta'], '.1f')}")


def client_table(c: dict) -> str:
    rows = [("step (wall-time delta)", _f(c["step_ms"])),
            ("deltas made a second (batch / step)", _f(c["produced_deltas_per_s"], ",.0f")),
            ("deltas read a second", _f(c["received_deltas_per_s"], ",.0f")),
            ("streams that failed", str(c["errors"]))]
    title = f"AsyncClient, {c['streams']} streams, {c['batch']} running"
    tail = f"\n  first failure: {c['first_error']}" if c.get("first_error") else ""
    return "\n\n".join([bl.table(rows, (title, "")) + tail,
                        cpu_table(c, "client: AsyncClient")])


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


def _case(name: str, fig: dict, table) -> str:
    return f"  {name}: error {fig['error']}" if "error" in fig else table(fig)


def report(doc: dict) -> str:
    parts = [_case(f"null x{k}", b, lambda b, k=k: null_table(k, b))
             for k, b in doc["null"].items()]
    if doc.get("asyncclient"):
        parts.append(_case("AsyncClient", doc["asyncclient"], client_table))
    if doc.get("smol"):
        parts.append(_case("smol", doc["smol"], smol_table))
    m = doc["machine"]
    parts.append(f"  {m['cores']} cores, load {m['load_avg_1m']:.1f}, {m['date']}")
    return "\n\n".join(parts)
