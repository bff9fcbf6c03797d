"""The documents hold together: the README stays a short guide, every file path the prose
names exists, every markdown link and anchor resolves, and every citation of the design in
code (a docs file, a comma and a section's name in quotes, or the file and a #anchor) names a
heading of that file."""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

README_MAX_LINES = 260
# files the prose names that live outside this repository (llama.cpp's converter and
# reference quantizers)
OUTSIDE = {"convert_hf_to_gguf.py", "ggml-quants.c"}
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", "runs"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|c))(?![\w/])")
CITE = re.compile(r'(docs/[\w/.-]+\.md)(?:,?\s+"([^"]+)"((?:\s+and\s+"[^"]+")*)|#([\w-]+))')


def repo_root() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


ROOT = repo_root()


def repo_files(pattern: str) -> list[Path]:
    """The repository's files matching pattern, not walking into .venv, .git or runs."""
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        out += [Path(top, f) for f in files if fnmatch.fnmatch(f, pattern)]
    return out


def prose_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def headings(md: Path) -> list[str]:
    """The file's headings as plain text, outside fenced code."""
    out, fenced = [], False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(re.sub(r"[`*]", "", line.lstrip("#").strip()))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def doc_sections() -> set[str]:
    return {h for md in (ROOT / "docs").rglob("*.md") for h in headings(md)}


def test_readme_is_a_short_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def broken_links(md: Path) -> list[str]:
    bad = []
    for target in LINK.findall(md.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
            bad.append(f"{target} (no such heading)")
    return bad


def test_every_link_resolves():
    bad = {str(md.relative_to(ROOT)): b for md in prose_files() if (b := broken_links(md))}
    assert not bad, bad


def missing_paths(md: Path, names: set[str]) -> list[str]:
    text = LINK.sub("", md.read_text())
    bad = []
    for path in sorted(set(PATH.findall(text))):
        if "/" in path:
            ok = (ROOT / path).exists()
        else:
            ok = path in names or path in OUTSIDE
        if not ok:
            bad.append(path)
    return bad


def test_every_named_file_exists():
    names = {p.name for ext in ("*.py", "*.md", "*.c") for p in repo_files(ext)}
    bad = {str(md.relative_to(ROOT)): m for md in prose_files() if (m := missing_paths(md, names))}
    assert not bad, bad


def citations(text: str) -> list[tuple[str, str]]:
    """(file, section name or #anchor) for each citation; a citation may run over comment lines."""
    flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    out = []
    for file, name, more, anchor in CITE.findall(flat):
        if anchor:
            out.append((file, "#" + anchor))
        for n in [name, *re.findall(r'"([^"]+)"', more)]:
            if n:
                out.append((file, n))
    return out


def unresolved(file: str, ref: str, sections: set[str]) -> bool:
    target = ROOT / file
    if not target.exists():
        return True
    # a citation names the file that holds the text: docs/DESIGN.md, the index of
    # docs/design/, holds only its own headings
    pool = set(headings(target))
    if ref.startswith("#"):
        return ref[1:] not in {slug(h) for h in pool}
    return ref not in pool


def test_design_citations_resolve():
    sections = doc_sections()
    sources = [p for p in [*repo_files("*.py"), *prose_files()] if p != Path(__file__).resolve()]
    bad = sorted(f"{src.relative_to(ROOT)}: {file} {ref}" for src in sources
                 for file, ref in citations(src.read_text()) if unresolved(file, ref, sections))
    assert not bad, "\n".join(bad)
