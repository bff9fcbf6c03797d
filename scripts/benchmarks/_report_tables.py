"""Each benchmark JSON's table as Markdown, and the line under it saying how it was measured
(commit, date, load, model). Pure: a document in, text out; a key the JSON lacks (older
JSONs predate _provenance.py) reads "unknown" or "-", never an error."""
from __future__ import annotations

from scripts.benchmarks._markdown import (UNKNOWN, engine_flags, get, markdown,  # noqa: F401
                                          num)  # (rt.*)


# ---------------------------------------------------------------- provenance

def provenance(doc: dict) -> str:
    """commit (and whether dirty), date, load before and after, model."""
    commit, dirty, date = doc.get("commit"), doc.get("dirty"), doc.get("date")
    legacy = str(get(doc, "machine", "git_commit") or "")
    if commit is None and legacy:         # older JSONs: machine.git_commit, "+dirty" suffixed
        commit, dirty = legacy.removesuffix("+dirty"), legacy.endswith("+dirty")
    date = date or get(doc, "machine", "date")
    tree = UNKNOWN if dirty is None else "dirty" if dirty else "clean"
    load = {k: UNKNOWN if doc.get(k) is None else num(doc[k], ".2f")
            for k in ("load_before", "load_after")}
    cpu = get(doc, "machine", "cpu")
    where = f", on {cpu} ({get(doc, 'machine', 'cpu_vectors') or UNKNOWN})" if cpu else ""
    return (f"commit {(commit or UNKNOWN)[:7]} ({tree}), {date or UNKNOWN}{where}, load "
            f"{load['load_before']} before and {load['load_after']} after, "
            f"model {model_text(doc['model']) if 'model' in doc else UNKNOWN}")


def model_text(m) -> str:
    if isinstance(m, list):
        return " and ".join(model_text(x) for x in m) or "none"
    if isinstance(m, str):
        return f"{m} (weights {UNKNOWN})"
    if not isinstance(m, dict):
        return "none" if m is None else UNKNOWN
    w = m.get("weights", UNKNOWN)
    if w == "random" and m.get("preset"):
        return f"{m.get('name')} (random weights: preset {m.get('preset')}, seed {m.get('seed')})"
    if m.get("sha256"):
        return f"{m.get('name')} ({w} weights: {m.get('file')}, sha256 {m['sha256'][:12]})"
    return f"{m.get('name')} ({w})"


# ---------------------------------------------------------------- the kinds

def kind(doc: dict) -> str | None:
    """Which benchmark wrote `doc` (by its keys: older JSONs lack "benchmark")."""
    if "levels" in doc and "llamacpp" in doc:
        return "compare-llamacpp"
    if "systems" in doc and "compile" in doc:
        return "structured"
    if "phases" in doc and "ratios" in doc:
        return "compare"
    for name, key in (("quality", "ppl_engine"), ("overhead", "null_steps"),
                      ("whatif", "fit"), ("invariant", "cost"),
                      ("curve", "curve_cost_us_per_request")):
        if key in doc:
            return name
    if doc.get("benchmark") in ("speculative", "overhead-compare", "memory", "tool_calls",
                                "embed"):
        return doc["benchmark"]
    if "shared_t0" in (doc.get("on") or {}):
        return "prefix"
    if "settings" in doc and "ratios" in doc:
        return "scale"
    return None


def table(doc: dict) -> str:
    fn = TABLES.get(kind(doc))
    return fn(doc) if fn else "(no table for this JSON)"


def _ms_pair(f: dict, key: str) -> str:
    return f"{num(get(f, key, 'p50'), ',.0f')} / {num(get(f, key, 'p99'), ',.0f')}"


def compare_llamacpp(doc: dict) -> str:
    rows = []
    for c, row in (doc.get("levels") or {}).items():
        for name, label in (("engine", "tl-engine"), ("llamacpp", "llama.cpp")):
            f = row.get(name) or {}
            if name == "engine":
                hits = (f"{f['prefix_hit_tokens']} / {f['prefix_query_tokens']}"
                        if "prefix_query_tokens" in f else "not recorded")
                ratio = num(row.get("engine_over_llamacpp_tok_s"), ".2f")
                prefill = num(row.get("engine_over_llamacpp_prefill"), ".2f")
            else:
                hits, ratio, prefill = "cache off", "", ""
            bench = "" if name == "engine" else num(row.get("llamacpp_batched_bench_tok_s"))
            rows.append((c, label + (engine_flags(doc) if name == "engine" else ""),
                         num(f.get("output_tok_s")), _ms_pair(f, "ttft_ms"),
                         _ms_pair(f, "tpot_ms"), hits, ratio, _drawn(row, name), bench,
                         prefill))
    caches = doc.get("caches") or "not recorded (before each level started cold)"
    header = ("in flight", "system", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms",
              "prefix hit / query tokens", "tl-engine / llama.cpp")
    triad = ""
    if "bandwidth_gb_s" in doc:   # runs before the bandwidth figures keep their columns
        header += ("GB/s (of triad)", "llama-batched-bench tok/s",
                   "prefill tok/s, tl-engine / llama.cpp")
        triad = (f" Triad {num(doc['bandwidth_gb_s'], '.2f')} GB/s, bytes per token"
                 f" {num(get(doc, 'bytes_per_token', 'bytes_per_token'), ',.0f')}.")
    rows = [r[:len(header)] for r in rows]
    return markdown(header, rows) + f"\n\nCaches: {caches}.{triad}"


def _drawn(row: dict, name: str) -> str:
    """A system's bandwidth at concurrency 1 and its share of the triad; blank elsewhere."""
    gb_s = row.get(f"{name}_bandwidth_gb_s")
    if gb_s is None:
        return ""
    return f"{gb_s:.2f} ({row.get(f'{name}_bandwidth_fraction') or 0:.0%})"


COMPARE_LABELS = {"engine": "tl-engine (process group)",
                  "hf_sequential": "transformers `generate`, one request at a time",
                  "hf_static": "transformers `generate`, static batches",
                  "hf_cb": "transformers continuous batching"}


def compare(doc: dict) -> str:
    rows = []
    for n, label in COMPARE_LABELS.items():
        ph = get(doc, "phases", n)
        if ph is None:
            continue
        ag = get(doc, "agreement", n) or {}
        ratio = "1.00" if n == "engine" else num(get(doc, "ratios", f"engine_over_{n}"), ".2f")
        agree = (f"{round(ag['equal_frac'] * ag['compared'])} of {ag['compared']}"
                 if ag.get("equal_frac") is not None else "-")
        rows.append((label, ph.get("error", num(ph.get("tok_s"))), ph.get("requests_run", "-"),
                     ratio, agree))
    r = doc.get("rounds")
    how = (f"{r['count']} rounds of {'/'.join(map(str, r['slices']))} requests, the systems "
           "taking turns" if r else "the systems one after the other (no rounds recorded)")
    return (markdown(("system", "tok/s", "requests run", "tl-engine / it", "greedy agreement"),
                     rows) + f"\n\n{get(doc, 'workload', 'requests')} requests of the mixed "
            f"workload; {how}.")


def quality(doc: dict) -> str:
    rel = lambda v: "-" if v is None else f"{100 * v:+.3g}%"  # noqa: E731
    flags = f" `{doc['engine_args']}`" if doc.get("engine_args") else ""
    rows = [(f"tl-engine{flags}", num(doc.get("ppl_engine"), ".4f"), "-"),
            ("transformers", num(doc.get("ppl_transformers"), ".4f"),
             rel(doc.get("engine_vs_transformers"))),
            ("llama.cpp `llama-perplexity`", num(doc.get("ppl_llamacpp"), ".4f"),
             rel(doc.get("llamacpp_vs_engine")))]
    g = doc.get("greedy") or {}
    tail = (f"\n\nGreedy, first {g['first_tokens']} tokens of {g['requests']} chat prompts: "
            f"{g['identical']} identical to llama-server's." if g else "")
    return (markdown(("scorer", "perplexity", "vs the engine"), rows)
            + f"\n\n{doc.get('tokens', '-')} tokens scored." + tail)


def memory(doc: dict) -> str:
    s = doc.get("summary") or {}
    rows = [(mode, num(get(s, mode, "VmRSS"), ".0f"), num(get(s, mode, "VmHWM"), ".0f"),
             num(get(s, mode, "RssAnon"), ".0f"), num(get(s, mode, "runtime"), ".0f"),
             num(get(s, mode, "model"), ".0f"), num(get(s, mode, "load_s"), ".1f"))
            for mode in ("quantized", "dequantized")]
    return (markdown(("worker weights", "VmRSS MB", "peak MB", "anonymous MB",
                      "runtime MB", "model MB", "load s"), rows)
            + f"\n\nQuantized / float32 resident: {num(s.get('ratio_rss'), '.3f')} "
            f"(goal 0.35); of what the model adds to the runtime (VmRSS less the runtime's): "
            f"{num(s.get('ratio_model'), '.3f')}.")


def overhead(doc: dict) -> str:
    rows = [(f"null model, {size} running: ms a step", num(f.get("step_ms"), ".2f"),
             num(f.get("step_ms_no_overlap"), ".2f"))
            for size, f in (doc.get("null") or {}).items()]
    s = doc.get("smol") or {}
    if s:
        rows += [(f"smol, {s.get('batch')} running: step / forward in the run",
                  num(s.get("step_over_forward_in_run"), ".3f"),
                  num(s.get("step_over_forward_in_run_no_overlap"), ".3f")),
                 (f"smol, {s.get('batch')} running: step / the same batches offline",
                  num(s.get("step_over_forward"), ".3f"),
                  num(s.get("step_over_forward_no_overlap"), ".3f"))]
    split = overhead_split(doc)
    return markdown(("case", "overlapped", "plain (`--no-overlap`)"), rows) + split


def overhead_split(doc: dict) -> str:
    """Each process's CPU over the steady steps, where the JSON has it (older ones lack it)."""
    cases = [(f"null model, {size} running (sink)", f) for size, f in
             (doc.get("null") or {}).items()]
    c = doc.get("asyncclient") or {}
    cases.append((f"null model, {c.get('streams')} streams on one AsyncClient", c))
    rows = [(label, num(f.get("step_ms"), ".2f"), num(f.get("token_ms_at_client"), ".2f"),
             *(num(get(f, "cpu", k), ".2f") for k in ("core_ms_per_step", "worker_ms_per_step")),
             *(num(get(f, "cpu", k), ".1f") for k in ("frontend_us_per_delta",
                                                      "client_us_per_delta")),
             " / ".join(num(get(f, "cpu", "busy", k), ".2f")
                        for k in ("core", "worker", "frontend", "client")),
             num(get(f, "cpu", "received_over_produced"), ".2f"))
            for label, f in cases if "cpu" in f]
    if not rows:
        return ""
    failed = (f" On the AsyncClient, {c.get('errors')} streams failed"
              f"{' (the frontend dropped it)' if c.get('frontend_dropped_client') else ''}."
              if "cpu" in c else "")
    return ("\n\n" + markdown(("case", "ms a step", "ms a token at the client",
                                "core CPU ms/step", "worker CPU ms/step",
                                "frontend CPU us/delta", "client CPU us/delta",
                                "busy: core / worker / frontend / client",
                                "deltas read / made"), rows)
            + "\n\nCPU time (utime + stime, every thread) over the steady steps; busy: the"
            " share of one core each process used then; deltas read / made: below 1, the"
            " frontend or the client fell behind the core; a token at the client: the run's"
            " wall time over each request's tokens." + failed)


PREFIX_WORKLOADS = {"shared_t0": "shared, t=0", "shared_steady": "shared, Poisson",
                    "mixed": "mixed (no sharing)"}


def prefix(doc: dict) -> str:
    rows = []
    for w, label in PREFIX_WORKLOADS.items():
        for s in ("on", "off"):
            f = get(doc, s, w) or {}
            rows.append((label, s, num(get(f, "ttft_ms", "p50"), ",.0f"),
                         num(get(f, "ttft_ms", "p99"), ",.0f"), num(f.get("output_tok_s")),
                         num(f.get("hit_rate"), ".2f")))
    for s in ("on", "off"):
        rows.append(("chat", s, "", "", "", num(get(doc, s, "chat", "hit_rate"), ".2f")))
    return markdown(("workload", "cache", "TTFT p50 ms", "TTFT p99 ms", "out tok/s",
                     "hit rate"), rows)


def settings(doc: dict, extra: tuple = ()) -> list[tuple]:
    return [(name, *(f(m) for f in extra), num(m.get("output_tok_s")),
             num(get(m, "ttft_ms", "p50"), ",.0f"), num(get(m, "tpot_ms", "p50")))
            for name, m in (doc.get("settings") or {}).items()]


def scale(doc: dict) -> str:
    rows = settings(doc, (lambda m: " ".join(m.get("flags", [])),))
    ratios = "; ".join(f"{k} {num(v, '.2f')}" for k, v in (doc.get("ratios") or {}).items())
    return (markdown(("setting", "flags", "out tok/s", "TTFT p50 ms", "TPOT p50 ms"), rows)
            + f"\n\n{get(doc, 'workload', 'requests')} requests; {ratios or '-'}.")


def invariant(doc: dict) -> str:
    cost = doc.get("cost") or {}
    return (markdown(("batch-invariant", "out tok/s", "TTFT p50 ms", "TPOT p50 ms"),
                     settings(doc))
            + "\n\n" + "; ".join(f"{k} {num(v, '.3f')}" for k, v in cost.items()) + ".")


def curve(doc: dict) -> str:
    rows = [(n, num(m.get("median_us")), num(m.get("min_us")), num(m.get("max_us")))
            for n, m in (doc.get("settings") or {}).items()]
    w = doc.get("workload") or {}
    return (markdown(("setting", "us/request p50", "min", "max"), rows)
            + f"\n\n{w.get('turns')} turns each, alternating, of {w.get('requests')} requests "
            f"at {w.get('inflight')} in flight on the null model; CURVE costs "
            f"{num(doc.get('curve_cost_us_per_request'))} us per request.")


def speculative(doc: dict) -> str:
    rows = []
    for key, r in (doc.get("results") or {}).items():
        on, off = r.get("on") or {}, r.get("off") or {}
        acc = on.get("acceptance")
        rows.append((key, num(off.get("tpot_ms_p50")), num(on.get("tpot_ms_p50")),
                     num(r.get("tpot_on_over_off"), ".2f"), num(off.get("output_tok_s")),
                     num(on.get("output_tok_s")), num(r.get("tok_s_on_over_off"), ".2f"),
                     "-" if acc is None else num(acc, ".2f"),
                     num(on.get("tokens_per_decode_step"), ".2f"), r.get("differing_requests")))
    w = doc.get("workload") or {}
    peer = [f"{key}: TPOT p50 {num(get(r, 'llamacpp-off', 'tpot_ms_p50'))} ms plain, "
            f"{num(get(r, 'llamacpp-on', 'tpot_ms_p50'))} ms drafting "
            f"(on/off {num(r.get('llamacpp_tpot_on_over_off'), '.2f')}; the engine drafting "
            f"over it {num(r.get('tpot_on_over_llamacpp_on'), '.2f')})"
            for key, r in (doc.get("results") or {}).items() if "llamacpp-on" in r]
    tail = f" llama-server on the same file, {'; '.join(peer)}." if peer else ""
    return (markdown(("workload@in flight", "TPOT p50 ms off", "on", "on/off", "out tok/s off",
                      "on", "on/off", "acceptance", "tokens/decode step", "differing"), rows)
            + f"\n\n{_method(w)}, --num-draft {w.get('num_draft')}, greedy, "
            f"{w.get('max_tokens')} tokens at most, {w.get('turns')} alternating turns." + tail)


def _method(w: dict) -> str:
    """What drafted: n-grams, or a draft model (for the served type)."""
    spec = w.get("speculative") or "ngram"
    if spec == "ngram":
        return "n-gram drafts"
    served = f" for the model as {w['gguf_type']}" if w.get("gguf_type") else ""
    return f"drafts of the draft model {spec.split(':', 1)[1]}{served}"


WHATIF_FIGURES = ("makespan_s", "throughput_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50")


def whatif(doc: dict) -> str:
    rows = [(run, fig, num(get(doc, run, "measured", fig), ",.1f"),
             num(get(doc, run, "predicted", fig), ",.1f"),
             num(None if get(doc, run, "errors", fig) is None
                 else 100 * get(doc, run, "errors", fig), "+.1f") + "%")
            for run in ("a", "b") for fig in WHATIF_FIGURES]
    return (markdown(("run", "figure", "measured", "predicted", "error"), rows)
            + f"\n\nB: `{doc.get('b_flags')}`, predicted from A's log.")


STRUCTURED_LABELS = {"constrained": ("each under its schema", "on"),
                     "unconstrained": ("free", "on"),
                     "constrained_no_overlap": ("each under its schema", "off"),
                     "unconstrained_no_overlap": ("free", "off")}


def structured(doc: dict) -> str:
    rows = []
    for name, (label, overlap) in STRUCTURED_LABELS.items():
        f = get(doc, "systems", name) or {}
        share = f.get("mask_share")
        rows.append((label, overlap, num(f.get("output_tok_s")), _ms_pair(f, "tpot_ms"),
                     num(get(f, "mask_ms_per_step", "p50"), ".2f"),
                     num(None if share is None else 100 * share, ".1f") + "%"))
    return (markdown(("requests", "overlap", "out tok/s", "TPOT p50 / p99 ms",
                      "grammar ms a step (p50)", "grammar share of the worker's step"), rows)
            + "\n\n" + _structured_ratios(doc) + "\n\n" + _structured_compile(doc))


def _structured_ratios(doc: dict) -> str:
    r, g, cal = (doc.get(k) or {} for k in ("ratios", "goal", "calibration"))
    x = lambda k: num(r.get(k), ".2f") + "x"  # noqa: E731
    goal = ("" if "met" not in g else
            f" (goal {num(g.get('constrained_over_unconstrained_at_least'), '.1f')}x: "
            f"{'met' if g['met'] else 'not met'})")
    return (f"Throughput, constrained / free: {x('constrained_over_unconstrained')} "
            f"overlapped{goal}, {x('constrained_over_unconstrained_no_overlap')} without. "
            f"Overlap's gain (on / off): constrained {x('overlap_gain_constrained')}, free "
            f"{x('overlap_gain_unconstrained')}. The worker's step less its grammars, "
            f"constrained / free: {x('worker_rest_constrained_over_unconstrained')}. "
            f"{get(doc, 'workload', 'in_flight')} requests in flight, "
            f"{get(doc, 'workload', 'rounds')} rounds; calibration: "
            f"{cal.get('valid_json', '-')} of {cal.get('requests', '-')} outputs valid under "
            "their schema.")


def _structured_compile(doc: dict) -> str:
    c = doc.get("compile") or {}
    pair = lambda k: f"{num(get(c, k, 'p50'), '.3f')} / {num(get(c, k, 'p99'), '.3f')}"  # noqa: E731
    return (f"Compile per schema, p50 / p99 ms: cold {pair('cold_ms')}, cached "
            f"{pair('cached_ms')}; first mask cold {pair('first_mask_cold_ms')}, cached "
            f"{pair('first_mask_cached_ms')}; the tokenizer's set-up "
            f"{num(c.get('tokenizer_setup_ms'), ',.0f')} ms, once per worker.")


def overhead_compare(doc: dict) -> str:
    """Two commits' `scripts/bench overhead` runs, turns alternating, and new over old."""
    runs = doc.get("runs") or []
    head = "| figure | " + " | ".join(f"{r['turn']} ({r['commit'][:7]})" for r in runs)
    lines = [head + " | new / old |", "|---" * (len(runs) + 2) + "|"]
    for key, ratio in (doc.get("new_over_old") or {}).items():
        cells = " | ".join(num(r.get(key), ".3f") for r in runs)
        lines.append(f"| {key} | {cells} | {num(ratio, '.3f')} |")
    loads = ", ".join(f"{r['turn']} {num(r.get('load_before'), '.2f')}" for r in runs)
    return "\n".join(lines) + f"\n\n{doc.get('what', '')}. Load before each turn: {loads}."


def tool_calls(doc: dict) -> str:
    rows = [(mode, r.get("requests"), num(_pct(r.get("ok_share"))),
             num(_pct(r.get("usable_share"))), num(_pct(r.get("tool_calls_finish_share"))),
             num(_pct(r.get("right_tool_share"))), r.get("leaked"))
            for mode, r in (doc.get("results") or {}).items()]
    w = doc.get("workload") or {}
    return (markdown(("tool_choice", "replies", "ok %", "usable %", "ends tool_calls %",
                      "right tool %", "call text in content"), rows)
            + f"\n\nGreedy, {w.get('max_tokens')} tokens at most, parallel_tool_calls "
            "left on; ok: ends `tool_calls` with every call's arguments valid under its schema.")


def embed(doc: dict) -> str:
    w, best = doc.get("workload") or {}, doc.get("best") or {}
    labels = {"embed": "embeddings", "prefill": "generation, max_tokens 1",
              "generate": f"generation, max_tokens {w.get('output_len')}"}
    rows = [(label, num((best.get(t) or {}).get("input_tok_s"), ",.0f"),
             num((best.get(t) or {}).get("output_tok_s")), (best.get(t) or {}).get("errors"))
            for t, label in labels.items()]
    return (markdown(("turn (best of the rounds)", "prompt tok/s", "output tok/s", "errors"),
                     rows) + f"\n\n{w.get('requests')} prompts of {w.get('prompt_len')} tokens"
            " a turn, the turns alternating, each drawing its own ids.")


def _pct(share):
    return None if share is None else 100 * share


TABLES = {"compare-llamacpp": compare_llamacpp, "compare": compare, "quality": quality,
          "overhead-compare": overhead_compare, "overhead": overhead, "prefix": prefix,
          "scale": scale, "invariant": invariant,
          "whatif": whatif, "structured": structured, "curve": curve,
          "speculative": speculative, "memory": memory, "tool_calls": tool_calls,
          "embed": embed}
