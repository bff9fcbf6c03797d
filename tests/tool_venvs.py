"""The tool venvs the selected tests use (scripts/evaltools/toolenv.py), installed in the
background from the session's start. A test marks what it needs with
`@pytest.mark.tool_venvs(TOOL, ...)`; it still calls bin_dir itself, which waits on the
install's lock, so a test never runs on a half-installed venv and a failed install fails
that test with pip's lines (here it is only dropped). Why: on a machine without pip's cache
the four installs are minutes of downloads that would otherwise each stop the suite."""
from __future__ import annotations

import threading

from core.thread_nice import lower_this_thread


def needed(items) -> list:
    """The tools the items' markers name, in the order the items first need them."""
    tools: list = []
    for item in items:
        for mark in item.iter_markers("tool_venvs"):
            for tool in mark.args:
                if tool not in tools:
                    tools.append(tool)
    return tools


def start_installs(items) -> threading.Thread | None:
    tools = needed(items)
    if not tools:
        return None
    thread = threading.Thread(target=_install_all, args=(tools,), name="tool-venvs",
                              daemon=True)
    thread.start()
    return thread


def _install_all(tools: list) -> None:
    from scripts.evaltools.toolenv import ToolInstallFailed, bin_dir
    # nice 19 (the most) for this thread and the pips it starts: they take only the cores
    # the tests leave idle (a test's own torch threads spin, and a core taken from them costs
    # far more than the install gains), and a test that waits on the install's lock leaves it
    # both
    lower_this_thread(19)
    for tool in tools:
        try:
            bin_dir(tool)
        except ToolInstallFailed:
            pass   # the test's own bin_dir call installs again and reports
