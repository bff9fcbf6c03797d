"""`scripts/bench compare --peer llamacpp`: tl-engine and llama.cpp's llama-server side by
side on the same workload, model weights (GGUF f32) and concurrency levels.

For each level N (--concurrency, default 1,8,64) both systems run the whole workload with
at most N requests in flight, each started cold for the level: a fresh engine process group
and a fresh llama-server with N slots (its prompt cache off), both stopped after it. The
engine's prefix cache stays on; its hits are recorded per level (the prompts share no
prefix, so they stay near 0). Within a level the two take turns over consecutive rounds of
the workload (`rounds`), so that this machine's drift in speed lands on both alike.
Reported per level and system: output tok/s, TTFT and TPOT p50/p99 (client side, from the
moment a request is sent), and how many requests' first --agree-first greedy tokens differ
(docs/design/benchmarks.md, "llama.cpp as a peer"). Also (_compare_bandwidth.py): the triad's
bandwidth, measured first; at concurrency 1 each system's bytes per token over its TPOT and
that as a fraction of the triad; and llama-batched-bench's TG tok/s at each level.
"""
from __future__ import annotations

import asyncio
import signal
import tempfile
from pathlib import Path

from scripts.benchmarks import _compare_bandwidth as cbw
from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import _llamacpp_get as get
from scripts.benchmarks import _llamacpp_serve as serve
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import _real_size
from scripts.benchmarks import bandwidth as bw
from scripts.benchmarks import common as bl

SYSTEMS = ("engine", "llamacpp")
LABELS = {"engine": "tl-engine", "llamacpp": "llama.cpp"}
CTX_ROUND = 256
ROUND_MIN = 16   # requests per round at least, and at least 4x the level's concurrency
CACHES = ("cold per level: a fresh engine and a fresh llama-server for each level; "
          "llama.cpp's prompt cache off, the engine's prefix cache on with its hits recorded")


def slot_ctx(reqs) -> int:
    """Per-slot context: the longest request, rounded up."""
    longest = max(len(r.prompt) + r.max_tokens for r in reqs)
    return -(-longest // CTX_ROUND) * CTX_ROUND


def first_token_agreement(engine: list, peer: list, first: int, eog=()) -> dict:
    """Requests (that both ran) whose first `first` tokens differ, with a few examples, and
    how many of all divergences (anywhere) are at an engine token llama.cpp bans (`eog`)."""
    pairs = [(i, e, p) for i, (e, p) in enumerate(zip(engine, peer))
             if e is not None and p is not None]
    examples, differ = [], 0
    at_eog = sum(1 for _, e, p in pairs
                 if (k := next((k for k, (x, y) in enumerate(zip(e, p)) if x != y), None))
                 is not None and e[k] in eog)
    for i, e, p in pairs:
        at = next((k for k, (x, y) in enumerate(zip(e[:first], p[:first])) if x != y), None)
        if at is None and len(e[:first]) == len(p[:first]):
            continue
        differ += 1
        if len(examples) < 5:
            examples.append({"request": i, "position": at,
                             "engine": e[at] if at is not None else None,
                             "llamacpp": p[at] if at is not None else None})
    return {"first_tokens": first, "compared": len(pairs), "differ": differ,
            "examples": examples, "diverged_at_eog": at_eog, **{f"whole_{k}": v for k, v in
                                     cs.agreement(engine, peer).items() if k != "compared"}}


def _figures(runs: list[bl.RunResult], engine: bool) -> dict:
    """One system's figures at one level over its rounds (the engine's with its
    prefix-cache tokens)."""
    run = cs.merged(runs)
    m = bl.metrics(run)
    keep = ("requests", "completed", "errors", "first_errors", "output_tokens", "wall_s",
            "output_tok_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "ids_partial")
    out = {k: m[k] for k in keep}
    out["round_wall_s"] = [r.wall for r in runs]
    if engine:
        out.update(cs.prefix_hits(run))
    out["outputs"] = [t.tokens if t.error is None and not t.ids_partial else None
                      for t in run.traces]
    return out


def rounds(reqs: list, c: int) -> list[list]:
    """The workload as consecutive rounds of at least max(ROUND_MIN, 4c) requests (one
    round where it holds fewer): short enough that the machine's speed moves little within
    one, long enough that c requests stay in flight through most of it."""
    return cs.split(reqs, max(1, len(reqs) // max(ROUND_MIN, 4 * c)))


class Peer:
    """llama-server, built and converted on first use; one server per level."""

    def __init__(self, a, facts):
        cs.say("== llama.cpp (llama-server)")
        self.binary = get.ensure_server()
        same = a.gguf is not None   # both serve this very file, as stored
        self.gguf = Path(a.model) if same else get.ensure_model(a.model, Path(facts["path"]))
        self.checked = get.check_model(self.gguf, Path(facts["path"]), same_file=same)
        self.threads = serve.threads()
        self.logdir = Path(tempfile.mkdtemp(prefix="tl-bench-llamacpp-"))

    def start(self, reqs, c: int):
        args = serve.server_args(self.binary, self.gguf, serve.free_port(), c, slot_ctx(reqs),
                                 self.threads)
        srv = serve.Server(args, self.logdir / f"llama-server-x{c}.log")
        try:
            srv.wait_ready()
            asyncio.run(serve.drive(srv.url, cs.warmup(reqs), c, progress=False))
        except BaseException:
            srv.stop()
            raise
        return srv

    def facts(self) -> dict:
        return {"binary": str(self.binary), "gguf": str(self.gguf),
                "gguf_facts": self.checked, "threads": self.threads}


def drive_engine(a, address: str, reqs, c: int, label: str):
    """The engine's run of `reqs` at concurrency c (greedy, EOS ignored, as llama.cpp's)."""
    return bl.drive(address, reqs, progress=a.progress, timeout=3600, label=label,
                    concurrency=c, temperature=0.0, ignore_eos=True)


def run_level(a, reqs, c: int, peer: Peer) -> tuple[dict, dict, list]:
    """Both systems cold at concurrency c (a fresh engine group, a fresh llama-server),
    taking turns round by round (who goes first alternates); the engine's and llama.cpp's
    figures, and the engine's serve args."""
    load = cs.settle()
    g, args = cs.start_engine(a, reqs)
    try:
        srv = peer.start(reqs, c)
        try:
            runs = {"engine": [], "llamacpp": []}
            parts = rounds(reqs, c)
            for i, (part, order) in enumerate(zip(parts, cs.turns(("llamacpp", "engine"),
                                                                  len(parts)))):
                for name in order:
                    label = f"{LABELS[name]} x{c} round {i + 1}"
                    run = (drive_engine(a, g.address, part, c, label) if name == "engine" else
                           serve.drive(srv.url, part, c, progress=a.progress, label=label))
                    runs[name].append(asyncio.run(run))
        finally:
            srv.stop()
    finally:
        g.stop()
    return ({**_figures(runs["engine"], True), "load_at_start": load},
            {**_figures(runs["llamacpp"], False), "server_args": srv.args[1:],
             "log": str(srv.log)}, args)


def run_both(a, reqs, facts) -> dict:
    """Each system's {levels, ...}, or {"error"} where it could not run."""
    try:
        peer = Peer(a, facts)
    except Exception as e:  # the engine still runs alone
        import traceback
        traceback.print_exc()
        return {"engine": run_engine_alone(a, reqs),
                "llamacpp": {"error": f"{type(e).__name__}: {e}"}}
    cs.say("== tl-engine (process group) and llama.cpp, level by level, each cold")
    levels, args = {"engine": {}, "llamacpp": {}}, None
    for c in a.concurrency:
        levels["engine"][c], levels["llamacpp"][c], args = run_level(a, reqs, c, peer)
    return {"engine": {"serve_args": args, "levels": levels["engine"]},
            "llamacpp": {**peer.facts(), "levels": levels["llamacpp"],
                         "batched_bench": run_batched_bench(a, reqs, peer)}}


def run_batched_bench(a, reqs, peer: Peer) -> dict:
    """llama-batched-bench's TG tok/s per level ({"error"} where it could not run)."""
    cs.say("== llama.cpp (llama-batched-bench) at the workload's mean lengths")
    try:
        binary = get.ensure_tool("llama-batched-bench")
        return {"tok_s": cbw.batched_bench(binary, peer.gguf, bl.describe(reqs),
                                           a.concurrency, peer.threads,
                                           peer.logdir / "llama-batched-bench.log")}
    except Exception as e:  # the servers' figures stand without it
        return {"error": f"{type(e).__name__}: {e}"}


def run_engine_alone(a, reqs) -> dict:
    """The engine's levels without its peer, each on a fresh group as above."""
    levels, args = {}, None
    for c in a.concurrency:
        g, args = cs.start_engine(a, reqs)
        try:
            levels[c] = _figures([asyncio.run(drive_engine(a, g.address, reqs, c,
                                                           f"tl-engine x{c}"))], True)
        finally:
            g.stop()
    return {"serve_args": args, "levels": levels}


def summary(a, reqs, tokens, res: dict, triad: dict | None = None) -> dict:
    doc = {"model": a.model, "dtype": "float32", "concurrency": a.concurrency,
           "weights": (f"the GGUF file's own blocks on both sides ({a.gguf_type or 'as shipped'})"
                       if a.gguf else "float32 on both sides"),
           "caches": CACHES,
           "workload": {**bl.MIXED, **bl.describe(reqs), "token_range": list(tokens)},
           "machine": bl.machine(), "levels": {}}
    for name in SYSTEMS:
        r = res.get(name, {})
        doc[name] = {k: v for k, v in r.items() if k != "levels"}
    for c in a.concurrency:
        lv = {n: res.get(n, {}).get("levels", {}).get(c) for n in SYSTEMS}
        row = {n: ({k: v for k, v in f.items() if k != "outputs"} if f else None)
               for n, f in lv.items()}
        if lv["engine"] and lv["llamacpp"]:
            e, p = lv["engine"], lv["llamacpp"]
            row["engine_over_llamacpp_tok_s"] = (e["output_tok_s"] / p["output_tok_s"]
                                                 if p["output_tok_s"] else None)
            row["engine_over_llamacpp_tpot_p50"] = (e["tpot_ms"]["p50"] / p["tpot_ms"]["p50"]
                                                    if p["tpot_ms"]["p50"] else None)
            row["engine_over_llamacpp_prefill"] = prefill_ratio(e, p)
            eog = res["llamacpp"]["gguf_facts"]["eog_ids"]
            row["agreement"] = first_token_agreement(e["outputs"], p["outputs"], a.agree_first,
                                                     set(eog))
        doc["levels"][c] = row
    add_bandwidth(doc, res, triad, a.gguf)
    same_file = a.gguf is not None
    doc["goals"] = goals(doc["levels"], same_file, same_file and _real_size.holds(a.gguf))
    return doc


def add_bandwidth(doc: dict, res: dict, triad: dict | None, gguf: str | None) -> None:
    """The triad, bytes per token and each system's bandwidth at concurrency 1, and
    llama-batched-bench's tok/s per level, where the run has them."""
    doc["bandwidth"] = triad
    doc["bandwidth_gb_s"] = triad["triad_gb_s"] if triad else None
    source = res.get("llamacpp", {}).get("gguf") or gguf
    doc["bytes_per_token"] = cbw.bytes_per_token(source) if source else None
    batched = res.get("llamacpp", {}).get("batched_bench", {}).get("tok_s", {})
    for c, row in doc["levels"].items():
        row["llamacpp_batched_bench_tok_s"] = batched.get(c)
    one = doc["levels"].get(1)
    if one is None or not (doc["bytes_per_token"] and triad):
        return
    for n in SYSTEMS:
        tpot = (one.get(n) or {}).get("tpot_ms", {}).get("p50")
        got = cbw.drawn(doc["bytes_per_token"]["bytes_per_token"], tpot, triad["triad_gb_s"])
        one[f"{n}_bandwidth_gb_s"], one[f"{n}_bandwidth_fraction"] = got["gb_s"], got["fraction"]


def goals(levels: dict, same_file: bool = False, real_size: bool = False) -> dict:
    """The goals, where the run has their levels (keys int, or str as a JSON file has them).
    On a real-size file (random weights in a 1B-3B model's shape, llama.cpp's own file): at
    concurrency 1 a TPOT p50 at most 0.9x of llama.cpp's and its prompt tokens/s at least
    1.0x (the same prompts one at a time: the ratio of mean TTFTs), at 8 and at 64 at least
    2x its tok/s. On the 135M model's own file (`--gguf`): at 64 at least 3x its tok/s, at 1
    a TPOT p50 at most 1.0x; on float32 weights, 1.5x and 1.5x."""
    def level(c: int) -> dict:
        return levels.get(c) or levels.get(str(c)) or {}
    out = {}
    if real_size:
        tok_goals, tpot_goal = {8: 2.0, 64: 2.0}, 0.9
    else:
        tok_goals, tpot_goal = {64: 3.0 if same_file else 1.5}, 1.0 if same_file else 1.5
    for c, goal in tok_goals.items():
        tok = level(c).get("engine_over_llamacpp_tok_s")
        if tok is not None:
            out[f"c{c}_tok_s_ratio_at_least_{goal}"] = {"ratio": tok, "met": tok >= goal}
    tpot = level(1).get("engine_over_llamacpp_tpot_p50")
    if tpot is not None:
        out[f"c1_tpot_ratio_at_most_{tpot_goal}"] = {"ratio": tpot, "met": tpot <= tpot_goal}
    prefill = level(1).get("engine_over_llamacpp_prefill") if real_size else None
    if prefill is not None:
        out["c1_prefill_ratio_at_least_1.0"] = {"ratio": prefill, "met": prefill >= 1.0}
    return out


def prefill_ratio(engine: dict, peer: dict) -> float | None:
    """The engine's prompt tokens/s over llama.cpp's: both served the same prompts, so the
    ratio of their mean TTFTs (meant for one request in flight, where nothing queues)."""
    e, p = engine["ttft_ms"].get("mean"), peer["ttft_ms"].get("mean")
    return p / e if e and p else None


def report(doc: dict) -> str:
    rows = []
    for c, row in doc["levels"].items():
        for n in SYSTEMS:
            f = row.get(n)
            if f is None:
                rows.append((c, LABELS[n], "error", "", "", "", "", ""))
                continue
            rows.append((c, LABELS[n], f"{f['output_tok_s']:.1f}",
                         *(bl._ms(f[k][q]) for k in ("ttft_ms", "tpot_ms") for q in ("p50", "p99")),
                         f["errors"]))
        ag = row.get("agreement")
        if ag:
            rows.append(("", "  engine / llama.cpp",
                         f"{row['engine_over_llamacpp_tok_s'] or 0:.2f}x", "", "",
                         f"{row['engine_over_llamacpp_tpot_p50'] or 0:.2f}x", "",
                         f"first {ag['first_tokens']} differ {ag['differ']}/{ag['compared']}, "
                         f"{ag['diverged_at_eog']} diverge at EOG"))
    w, m = doc["workload"], doc["machine"]
    head = (f"  {doc['model']} ({doc.get('weights', 'float32')}), workload mixed: {w['requests']} requests, "
            f"{w['max_output_tokens']} output tokens; {m['cores']} cores, llama.cpp threads "
            f"{doc['llamacpp'].get('threads', '-')}")
    tail = [f"  goal {k}: {v['ratio']:.2f} ({'met' if v['met'] else 'not met'})"
            for k, v in doc["goals"].items()]
    tail += [f"  {LABELS[n]}: {doc[n]['error']}" for n in SYSTEMS if "error" in doc[n]]
    tail += bandwidth_lines(doc)
    engine = {c: row.get("engine") or {} for c, row in doc["levels"].items()}
    hits = [f"{c}: {e['prefix_hit_tokens']}/{e['prefix_query_tokens']}"
            for c, e in engine.items() if "prefix_query_tokens" in e]
    if hits:
        tail.append(f"  engine prefix-cache hit/query tokens per level ({doc['caches']}): "
                    + ", ".join(hits))
    table = bl.table(rows, ("conc", "system", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                            "TPOT p99", "errors"))
    return "\n".join([head, table, *tail])


def bandwidth_lines(doc: dict) -> list[str]:
    """The report's lines for the triad, bytes per token and llama-batched-bench."""
    out = []
    if doc.get("bandwidth_gb_s"):
        out.append(f"  triad {doc['bandwidth_gb_s']:.2f} GB/s at {doc['bandwidth']['threads']}"
                   f" threads (read-only sum {doc['bandwidth']['sum_gb_s']:.2f})")
    one, bpt = doc["levels"].get(1) or {}, doc.get("bytes_per_token")
    if bpt:
        drawn = [f"{LABELS[n]} {one[f'{n}_bandwidth_gb_s']:.2f} GB/s"
                 f" ({one[f'{n}_bandwidth_fraction']:.0%} of the triad)" for n in SYSTEMS
                 if one.get(f"{n}_bandwidth_gb_s") is not None]
        out.append(f"  bytes/token {bpt['bytes_per_token'] / 1e6:.1f} MB"
                   + (f"; at c1: {', '.join(drawn)}" if drawn else ""))
    bench = {c: r["llamacpp_batched_bench_tok_s"] for c, r in doc["levels"].items()
             if r.get("llamacpp_batched_bench_tok_s") is not None}
    if bench:
        out.append("  llama-batched-bench TG tok/s: "
                   + ", ".join(f"c{c} {v:.1f}" for c, v in bench.items()))
    return out


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)   # so that `finally` stops llama-server and the group


def main(a, reqs, tokens, facts, start: prov.RunStart) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    cs.say("== memory bandwidth (triad)")
    triad = bw.measure(bw.DEFAULT_SIZE_MB, serve.threads(), bw.DEFAULT_RUNS)
    try:
        res = run_both(a, reqs, facts)
    except Exception as e:  # report what failed, as a run's result
        import traceback
        traceback.print_exc()
        res = {n: {"error": f"{type(e).__name__}: {e}"} for n in SYSTEMS}
    doc = summary(a, reqs, tokens, res, triad)
    print(report(doc))
    if a.json:
        bl.write_json(a.json, prov.stamp(doc, start, a.model))
    failed = any("error" in r for r in res.values()) or any(
        (row.get(n) or {}).get("errors", 1) for row in doc["levels"].values() for n in SYSTEMS)
    return 1 if failed else 0
