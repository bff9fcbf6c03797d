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
    stem = Path(str(model.get("file") or model.get("name", "") if isinstance(model, dict)
                    else model)).name.split(".")[0]
    label = (f"{stem} {name}" + (f" on {vectors}" if vectors else "")
             + rt.engine_flags(doc).replace("`", ""))
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


def _llamacpp_prefill_rows(doc: dict) -> list[tuple]:
    """The tok/s and TPOT rows, and the prompts' speed against llama.cpp's at every level
    (the figure --prefill-bf16 is for)."""
    rows = _llamacpp_file_rows(doc)
    levels = doc.get("levels") or {}
    if rows and levels:
        label = rows[0][0].split(", out tok/s")[0]
        rows.append((f"{label}, prefill tok/s ratio, {' / '.join(map(str, levels))} in flight",
                     "", "", " / ".join(_ratio(r.get("engine_over_llamacpp_prefill"))
                                        for r in levels.values())))
    return rows


def _llamacpp_tok_rows(doc: dict) -> list[tuple]:
    """The tok/s row alone (the 135M model's files, below the real-size ones)."""
    return _llamacpp_file_rows(doc)[:1]


def _quality_rows(doc: dict) -> list[tuple]:
    return [("perplexity: tl-engine / transformers / llama.cpp",
             rt.num(doc.get("ppl_engine"), ".4f"),
             f"{rt.num(doc.get('ppl_transformers'), '.4f')} / "
             f"{rt.num(doc.get('ppl_llamacpp'), '.4f')}", "")]


HEADLINE = (("compare-llamacpp-1b-q4_0.json", _llamacpp_file_rows),
            ("compare-llamacpp-1b-q4_k_m.json", _llamacpp_file_rows),
            ("compare-llamacpp-1b-q4_k_m-int8-bf16.json", _llamacpp_prefill_rows),
            ("compare-llamacpp-1b-q4_k_m-int8-avx2.json", _llamacpp_file_rows),
            ("compare-llamacpp-1b-q4_0-int8-avx2.json", _llamacpp_file_rows),
            ("compare-llamacpp-3b-q4_0.json", _llamacpp_file_rows),
            ("compare-llamacpp-3b-q4_k_m-int8-bf16.json", _llamacpp_file_rows),
            ("compare-llamacpp-q4_1.json", _llamacpp_tok_rows),
            ("quality.json", _quality_rows))   # the README's rows: at most 17


def _no_dirs(text: str) -> str:
    """Absolute paths as their file names: the machine's directories mean nothing to a
    reader (docs/bench/README.md keeps them)."""
    return re.sub(r"(?<![\w.])/[^\s,()]*/(?=[^\s/]+)", "", text)


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
    lines += [f"- `{name}`: {_no_dirs(rt.provenance(docs[name]))}" for name in used]
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
