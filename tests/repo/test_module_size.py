"""Every Python module stays under MAX_LINES (about 400: one concept a file), except the few
whose size is their design, each with its reason and its own ceiling."""
from __future__ import annotations

from tests.repo.test_docs import ROOT, repo_files

MAX_LINES = 400
# path -> (ceiling, why it is one file)
LARGER = {
    "core/sched.py": (640, "the scheduler's one class: its state (the running list, the waiting"
                           " heap, the blocks) is read by every phase, and splitting the class"
                           " would spread one object's state over files"),
    "core/ipc/protocol.py": (540, "every message type on every socket in one typed module,"
                                  " with its one encoder/decoder"),
    "tests/frontend/test_http.py": (420, "the gateway's end-to-end tests over one shared group"),
}


def lines(rel: str) -> int:
    return len((ROOT / rel).read_text().splitlines())


def test_every_module_stays_under_its_bound():
    over = {}
    for p in repo_files("*.py"):
        rel = str(p.relative_to(ROOT))
        bound = LARGER.get(rel, (MAX_LINES, ""))[0]
        if (n := len(p.read_text().splitlines())) > bound:
            over[rel] = n
    assert not over, f"modules over {MAX_LINES} lines (or their own ceiling): {over}"


def test_each_exception_is_still_needed():
    """A module that has come back under the bound leaves the list."""
    stale = [rel for rel in LARGER if not (ROOT / rel).exists() or lines(rel) <= MAX_LINES]
    assert not stale, stale
