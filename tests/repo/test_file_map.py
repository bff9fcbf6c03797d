"""ARCHITECTURE.md maps every file: its generated "Files" section is current, so a file
added, renamed or removed without `python -m scripts.file_map` fails here."""
from __future__ import annotations

from scripts import file_map


def test_every_file_has_its_line_in_the_map():
    want = file_map.block()
    have = file_map.current()
    missing = sorted(set(want.splitlines()) - set(have.splitlines()))
    stale = sorted(set(have.splitlines()) - set(want.splitlines()))
    assert have == want, ("ARCHITECTURE.md's file map is not current: run"
                          f" `.venv/bin/python -m scripts.file_map`\nmissing: {missing}\nstale: {stale}")


def test_a_line_is_the_files_own_first_sentence(tmp_path):
    py = tmp_path / "thing.py"
    py.write_text('"""The thing: what it holds, e.g. this. Then more.\n\nThe map leaves out."""\n')
    c = tmp_path / "k.c"
    c.write_text("/* A kernel. Its details\n * follow. */\nint x;\n")
    init = tmp_path / "__init__.py"
    init.write_text("")
    assert file_map.summary(py) == "The thing: what it holds, e.g. this."
    assert file_map.summary(c) == "A kernel."
    assert file_map.summary(init) is None          # an empty package marker has no line
