"""Shared fixtures: a process group per module (scripts/serve), stopped in teardown, whose
step log must then verify (every end-to-end run is also a replay test)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.group.harness import Group, start_group


def snapshot_log(log: Path, dst: Path) -> Path:
    """A consistent copy of a live group's step log (SQLite backup), for replay to read."""
    with sqlite3.connect(f"file:{log}?mode=ro", uri=True) as src, sqlite3.connect(dst) as out:
        src.backup(out)
    return dst


def verify_log(path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replay", "verify", *extra, str(path)],
                          capture_output=True, text=True, timeout=600)


def serving(tmp: Path, args, env=None, verify=((),)):
    """A group (scripts/serve with `args`) for the caller's tests, stopped afterwards; it must
    exit 0 and its step logs verify under each of `verify`'s extra arguments."""
    g = start_group(tmp, args, env=env)
    try:
        yield g
    finally:
        code = g.stop()
    assert code == 0, g.tail()
    for log in g.logs():
        for extra in verify:
            r = verify_log(log, *extra)
            assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def group(request, tmp_path_factory) -> Group:
    """A group on the tiny preset; a test module sets GROUP_ARGS for other flags and
    GROUP_ENV for variables added to the group's environment."""
    args = getattr(request.module, "GROUP_ARGS", [])
    env = getattr(request.module, "GROUP_ENV", None)
    yield from serving(tmp_path_factory.mktemp("group"), args, env)
