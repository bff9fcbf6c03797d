"""What every benchmark JSON records about how it was made: the commit and whether the tree
differed from it, the date, the machine's load before and after the run, and the model (random
or trained weights, the file's sha256).

A benchmark calls `begin` before it measures anything (a JSON asked of a dirty tree is refused
there, before minutes are spent) and `stamp` on its document before writing it. `report.py`
renders these keys under each table. Imports no torch.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts import ROOT

KEYS = ("benchmark", "commit", "dirty", "date", "load_before", "load_after", "model")


def add_client_run_options(p: argparse.ArgumentParser) -> None:
    """--timeout, --json, --no-progress and --allow-dirty: a client-driven benchmark's."""
    p.add_argument("--timeout", type=float, default=600, help="client timeout, seconds")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")
    add_allow_dirty(p)


def add_allow_dirty(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-dirty", action="store_true",
                   help="write --json from a tree that differs from its commit (the JSON "
                        'says "dirty": true)')


def tree_state(root: Path = ROOT) -> tuple[str | None, bool]:
    """(HEAD's commit, whether tracked or untracked files differ from it)."""
    def git(*args) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return git("rev-parse", "HEAD") or None, bool(git("status", "--porcelain"))


def load_1m() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class DirtyTree(SystemExit):
    """A JSON asked of a tree that differs from its commit, without --allow-dirty."""


@dataclass(frozen=True)
class RunStart:
    benchmark: str
    commit: str | None
    dirty: bool
    date: str
    load_before: float | None


def begin(benchmark: str, json_path: str | None, allow_dirty: bool,
          root: Path = ROOT) -> RunStart:
    """The run's facts at its start; exits 2 with one line where a JSON is asked of a dirty
    tree without --allow-dirty."""
    commit, dirty = tree_state(root)
    if json_path and dirty and not allow_dirty:
        print(f"{benchmark}: the tree differs from its commit {(commit or 'unknown')[:12]}: "
              "commit first, or give --allow-dirty (the JSON then says \"dirty\": true)",
              file=sys.stderr)
        raise DirtyTree(2)
    return RunStart(benchmark, commit, dirty, utc_now(), load_1m())


def stamp(doc: dict, start: RunStart, models, root: Path = ROOT) -> dict:
    """`doc` with the provenance keys first. `models`: a model name, several (a list: the
    JSON's "model" is then a list) or None (no model). The tree is read again: dirty if it
    was at either end or HEAD moved during the run."""
    commit, dirty = tree_state(root)
    head = {"benchmark": start.benchmark, "commit": start.commit,
            "dirty": start.dirty or dirty or commit != start.commit, "date": start.date,
            "load_before": start.load_before, "load_after": load_1m(),
            "model": models_record(models)}
    return {**head, **{k: v for k, v in doc.items() if k not in head}}


def models_record(models):
    if models is None:
        return None
    if isinstance(models, str):
        return model_record(models)
    return [model_record(n) for n in models]


def model_record(name: str) -> dict:
    """Whether `name`'s weights are random (a preset: its version and seed) or trained (a
    file: its sha256; a registry model's is the pinned one, checked when it is fetched)."""
    from worker.presets import PRESETS
    from worker.registry_models import REGISTRY
    if name == "null":
        return {"name": name, "weights": "none (the null runner: no model)"}
    if name in PRESETS:
        p = PRESETS[name]
        return {"name": name, "weights": "random", "preset": f"{p.name}-{p.version}",
                "seed": p.seed, "init_std": p.init_std}
    if name in REGISTRY:
        m = REGISTRY[name]
        return {"name": name, "weights": "trained", "file": m.filename, "sha256": m.sha256}
    path = Path(name).expanduser()
    files = [path] if path.is_file() else sorted(
        f for f in path.glob("*") if f.suffix in (".safetensors", ".bin", ".gguf"))
    return {"name": name, "weights": _weights_of(path), "file": path.name,
            "sha256": _sha256(files) if files else None}


def _weights_of(path: Path) -> str:
    """A real-size file (scripts/benchmarks/_real_size.py) holds random weights in a real
    model's shape; any other file is taken as trained."""
    from scripts.benchmarks import _real_size
    return "random" if _real_size.holds(path) else "trained"


def _sha256(files: list[Path]) -> str:
    """One file's sha256; of several, the sha256 of their names and digests."""
    from worker.gguf_file import hash_file
    if len(files) == 1:
        return hash_file(files[0])
    return hashlib.sha256("".join(f"{f.name}:{hash_file(f)}\n" for f in files)
                          .encode()).hexdigest()
