#!/usr/bin/env python
"""The benchmarks' tables, written from their JSONs in docs/bench/.

    scripts/bench report            # writes docs/bench/README.md and README.md's block
    scripts/bench report --check    # exit 1 with a diff where either differs

docs/bench/README.md: one section per JSON, its current table and, under it, the commit,
date, load and model it was measured at. README.md: between its lines `<!--
bench-report:begin -->` and `<!-- bench-report:end -->`, one headline table over those JSONs
(HEADLINE). Nothing else in README.md is written here; history is in git.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

from scripts import ROOT
from scripts.benchmarks import _report_tables as rt

BEGIN = "<!-- bench-report:begin -->"
END = "<!-- bench-report:end -->"
BENCH_DIR = "docs/bench"


def load(bench: Path) -> dict[str, dict]:
    """Every JSON in `bench` by file name, in name order."""
    return {p.name: json.loads(p.read_text()) for p in sorted(bench.glob("*.json"))}


def bench_readme(docs: dict[str, dict]) -> str:
    out = ["# Benchmark figures", "",
           "Written by `scripts/bench report` from the JSON files in this folder (do not edit "
           "by hand: `scripts/bench report` rewrites it, and a test checks it). Each table is "
           "its JSON's current figures; under it, the commit, date, machine load and model it "
           "was measured at. Earlier figures are in git's history.", ""]
    for name, doc in docs.items():
        out += [f"## `{name}`", "", rt.table(doc), "", f"_{rt.provenance(doc)}._", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- README's headline

def _ratio(v) -> str:
    return "-" if v is None else f"{rt.num(v, '.2f')}x"


def file_type(path: str) -> str:
    """The type a GGUF file's name gives (`....Q4_1.gguf` -> Q4_1), else its name."""
    m = re.search(r"\.([A-Z0-9_]+)\.gguf$", path)
    return m.group(1) if m else Path(path).name


def _llamacpp_file_rows(doc: dict) -> list[tuple]:
    """On the GGUF file's own blocks (`compare --gguf`): tok/s at every level in one row
    (ratios likewise), TPOT p50 at 1 in flight in another."""
    model = doc.get("model") or ""   # provenance's record (a dict) or the name given
    name = file_type(model.get("file") or model.get("name", "") if isinstance(model, dict)
                     else str(model))
    vectors = rt.get(doc, "machine", "cpu_vectors")   # the kernels' paths differ by ISA
    label = f"{name} file on {vectors}" if vectors else f"{name} file"
    levels = doc.get("levels") or {}
    if not levels:
        return []
    side = lambda row, n: rt.num((row.get(n) or {}).get("output_tok_s"))  # noqa: E731
    rows = [(f"{label}, out tok/s, {' / '.join(map(str, levels))} in flight: "
             "tl-engine / llama.cpp",
             " / ".join(side(r, "engine") for r in levels.values()),
             " / ".join(side(r, "llamacpp") for r in levels.values()),
             " / ".join(_ratio(r.get("engine_over_llamacpp_tok_s")) for r in levels.values()))]
    one = levels.get("1") or levels.get(1) or {}
    if one.get("engine") and one.get("llamacpp"):
        rows.append((f"{label}, TPOT p50 ms, 1 in flight: tl-engine / llama.cpp",
                     rt.num(one["engine"]["tpot_ms"]["p50"], ".1f"),
                     rt.num(one["llamacpp"]["tpot_ms"]["p50"], ".1f"),
                     _ratio(one.get("engine_over_llamacpp_tpot_p50"))))
    return rows


def _transformers_rows(doc: dict) -> list[tuple]:
    eng = doc.get("engine_tok_s")
    return [(f"tok/s: tl-engine / {rt.COMPARE_LABELS[n]}", rt.num(eng),
             rt.num(doc.get(f"{n}_tok_s")), _ratio(rt.get(doc, "ratios", f"engine_over_{n}")))
            for n in ("hf_sequential", "hf_static", "hf_cb") if f"{n}_tok_s" in doc]


def _quality_rows(doc: dict) -> list[tuple]:
    return [("perplexity: tl-engine / transformers / llama.cpp",
             rt.num(doc.get("ppl_engine"), ".4f"),
             f"{rt.num(doc.get('ppl_transformers'), '.4f')} / "
             f"{rt.num(doc.get('ppl_llamacpp'), '.4f')}", "")]


def _overhead_rows(doc: dict) -> list[tuple]:
    null = doc.get("null") or {}
    both = lambda key, fmt: " / ".join(rt.num(f.get(key), fmt) for f in null.values())  # noqa: E731
    sizes = " / ".join(null)
    plain = both("step_ms_no_overlap", ".2f")
    rows = [(f"ms a step, null model, {sizes} running" + (": overlapped / plain" if "-" not in plain
             else ""), both("step_ms", ".2f"), "" if "-" in plain else plain, "")] if null else []
    fe = [doc.get(f"frontend_us_per_delta_null_{n}") for n in null]
    if any(v is not None for v in fe):
        rows.append((f"frontend CPU us a delta, null model, {sizes} running",
                     " / ".join(rt.num(v, ".1f") for v in fe), "", ""))
    s = doc.get("smol") or {}
    if s:
        off = s.get("step_over_forward_in_run_no_overlap")
        rows.append(("smol step / its forward in the run" + (": overlapped / plain" if off
                                                               else ", 64 running"),
                     rt.num(s.get("step_over_forward_in_run"), ".3f"),
                     "" if off is None else rt.num(off, ".3f"), ""))
    return rows


def _prefix_rows(doc: dict) -> list[tuple]:
    on, off = (rt.get(doc, s, "shared_t0", "ttft_ms", "p50") for s in ("on", "off"))
    return [("TTFT p50 ms, shared prefix: cache on / off", rt.num(on, ",.0f"),
             rt.num(off, ",.0f"),
             _ratio(rt.get(doc, "ratios", "shared_t0", "ttft_p50_off_over_on")))]


def _scale_rows(doc: dict) -> list[tuple]:
    """Each ratio "throughput A/B": A's and B's out tok/s."""
    rows = []
    for key, v in (doc.get("ratios") or {}).items():
        a, _, b = key.rpartition(" ")[2].partition("/")
        rows.append((f"out tok/s, scale-out: {a} / {b}",
                     rt.num(rt.get(doc, "settings", a, "output_tok_s")),
                     rt.num(rt.get(doc, "settings", b, "output_tok_s")), _ratio(v)))
    return rows


def _invariant_rows(doc: dict) -> list[tuple]:
    on, off = (rt.get(doc, "settings", s, "output_tok_s") for s in ("on", "off"))
    return [("out tok/s, batch-invariant on / off", rt.num(on), rt.num(off),
             _ratio(rt.get(doc, "cost", "throughput on/off")))]


def _structured_rows(doc: dict) -> list[tuple]:
    c, u = (rt.get(doc, "systems", s, "output_tok_s") for s in ("constrained", "unconstrained"))
    n = rt.get(doc, "workload", "in_flight")
    return [(f"out tok/s, {n} in flight: each under its JSON schema / free", rt.num(c),
             rt.num(u), _ratio(rt.get(doc, "ratios", "constrained_over_unconstrained")))]


def _speculative_rows(doc: dict) -> list[tuple]:
    r = (doc.get("results") or {}).get("copy@1") or {}
    on, off, peer = (rt.get(r, s, "tpot_ms_p50") for s in ("on", "off", "llamacpp-on"))
    rows = [("TPOT p50 ms, copy-heavy, 1 in flight: n-gram drafts on / off", rt.num(on),
             rt.num(off), _ratio(r.get("tpot_on_over_off")))] if r else []
    if peer is not None:
        rows.append(("TPOT p50 ms, copy-heavy, 1 in flight, both drafting: tl-engine / llama.cpp",
                     rt.num(on), rt.num(peer), _ratio(r.get("tpot_on_over_llamacpp_on"))))
    return rows


def _draft_rows(doc: dict) -> list[tuple]:
    r = (doc.get("results") or {}).get("chat@1") or {}
    typ = rt.get(doc, "workload", "gguf_type") or "?"
    on, off, peer = (rt.get(r, s, "tpot_ms_p50") for s in ("on", "off", "llamacpp-on"))
    rows = [(f"TPOT p50 ms, chat, 1 in flight, {typ}: Q4_1 draft model on / off", rt.num(on),
             rt.num(off), _ratio(r.get("tpot_on_over_off")))] if r else []
    if peer is not None:
        rows.append((f"TPOT p50 ms, chat, 1 in flight, {typ}, both drafting: tl-engine / "
                     "llama.cpp", rt.num(on), rt.num(peer),
                     _ratio(r.get("tpot_on_over_llamacpp_on"))))
    return rows


HEADLINE = (("compare-llamacpp-q4_1.json", _llamacpp_file_rows),
            ("compare-llamacpp-q4_1-avx2.json", _llamacpp_file_rows),
            ("compare-llamacpp-q8_0.json", _llamacpp_file_rows),
            ("compare-llamacpp-q8_0-avx2.json", _llamacpp_file_rows),
            ("compare-smol.json", _transformers_rows),
            ("quality.json", _quality_rows), ("overhead.json", _overhead_rows),
            ("prefix-smol.json", _prefix_rows), ("scale-dp-smol.json", _scale_rows),
            ("invariant-smol.json", _invariant_rows),
            ("structured-smollm2.json", _structured_rows),
            ("speculative-smollm2.json", _speculative_rows),
            ("speculative-draft-f32.json", _draft_rows))


def headline(docs: dict[str, dict]) -> str:
    rows, used = [], []
    for name, fn in HEADLINE:
        if name in docs:
            got = fn(docs[name])
            rows += [(*r, f"[{name}]({BENCH_DIR}/{name})") for r in got]
            used += [name] if got else []
    lines = [rt.markdown(("figure", "tl-engine", "the other", "ratio", "JSON"), rows), "",
             f"Every benchmark's table, with how it was measured: [`{BENCH_DIR}/README.md`]"
             f"({BENCH_DIR}/README.md). Written by `scripts/bench report` from the JSONs; "
             "measured at:", ""]
    lines += [f"- `{name}`: {rt.provenance(docs[name])}" for name in used]
    return "\n".join(lines)


def with_block(readme: str, block: str) -> str:
    """`readme` with the text between its BEGIN and END lines replaced by `block`."""
    lines = readme.split("\n")
    if lines.count(BEGIN) != 1 or lines.count(END) != 1 or lines.index(BEGIN) > lines.index(END):
        raise ValueError(f"README.md needs one {BEGIN} line before one {END} line")
    i, j = lines.index(BEGIN), lines.index(END)
    return "\n".join(lines[:i + 1] + block.split("\n") + lines[j:])


# ---------------------------------------------------------------- main

def expected(root: Path) -> dict[Path, str]:
    """Each file this writes, and what it should hold."""
    docs = load(root / BENCH_DIR)
    readme = root / "README.md"
    return {root / BENCH_DIR / "README.md": bench_readme(docs),
            readme: with_block(readme.read_text(), headline(docs))}


def check(want: dict[Path, str]) -> list[str]:
    """A unified diff for each file that differs from what it should hold."""
    diffs = []
    for path, text in want.items():
        have = path.read_text() if path.exists() else ""
        if have != text:
            diffs.append("".join(difflib.unified_diff(
                have.splitlines(True), text.splitlines(True), f"{path} (as it is)",
                f"{path} (as scripts/bench report writes it)")))
    return diffs


def main(argv=None, root: Path = ROOT) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench report", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 with a diff where a file differs")
    a = p.parse_args(argv)
    try:
        want = expected(root)
    except ValueError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if a.check:
        diffs = check(want)
        print("\n".join(diffs), end="")
        if diffs:
            print("report: out of date; run scripts/bench report", file=sys.stderr)
        return 1 if diffs else 0
    for path, text in want.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
