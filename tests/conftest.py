"""Shared fixtures: a process group (scripts/serve) shared by the modules that ask for the
same flags, stopped when a module asks for other flags and at the session's end; it must
then exit 0 and its step log verify (every end-to-end run is also a replay test)."""
from __future__ import annotations

import io
import sqlite3
import subprocess
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from scripts.group.harness import Group, start_group
from tests.tool_venvs import start_installs

TOOL_INSTALLS = pytest.StashKey()   # the session's background installs (a thread or None)


def snapshot_log(log: Path, dst: Path) -> Path:
    """A consistent copy of a live group's step log (SQLite backup), for replay to read."""
    with sqlite3.connect(f"file:{log}?mode=ro", uri=True) as src, sqlite3.connect(dst) as out:
        src.backup(out)
    return dst


def verify_log(path, *extra) -> subprocess.CompletedProcess:
    """`python -m replay verify EXTRA PATH` as its exit code and output, run in this process:
    torch and transformers are loaded here already, and a subprocess spent ~3.5 s of its
    ~4 s loading them again (`--with-model`). One at a time (its output is this process's
    stdout and stderr, redirected). It leaves `os.environ` alone (where torch is loaded, replay
    does not set its threads' wait policy), which the groups a background thread starts
    meanwhile copy."""
    from replay.__main__ import main
    args = ["verify", *extra, str(path)]
    out, err = io.StringIO(), io.StringIO()
    with _REPLAYING, redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as e:   # argparse's refusals
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["replay", *args], code, out.getvalue(), err.getvalue())


_REPLAYING = threading.Lock()


def check_stopped(g: Group, verify=((),), who: str = "") -> None:
    """Stop `g` (if it still runs): it must exit 0 and its step logs verify under each of
    `verify`'s extra arguments."""
    code = g.stop()
    assert code == 0, f"{who}{g.tail()}"
    for log in g.logs():
        for extra in verify:
            r = verify_log(log, *extra)
            assert r.returncode == 0, who + r.stdout + r.stderr


def serving(tmp: Path, args, env=None, verify=((),)):
    """A group (scripts/serve with `args`) for the caller's tests, stopped afterwards and
    checked as check_stopped says."""
    g = start_group(tmp, args, env=env)
    try:
        yield g
    finally:
        check_stopped(g, verify)


def group_key(module) -> tuple:
    """What makes a module's group: its GROUP_ARGS and GROUP_ENV."""
    env = getattr(module, "GROUP_ENV", None) or {}
    return tuple(getattr(module, "GROUP_ARGS", [])), tuple(sorted(env.items()))


class GroupPool:
    """The session's live group of the `group` fixture. A start is seconds on 2 cores, so a
    module whose flags are the last module's gets the same group (while it runs); another
    module's flags stop it, checked, first. The next flags of the run's order (`order`, what
    pytest_collection_modifyitems leaves) start in the background while a module's tests
    run: the suite uses about one core of two, and a start is ~3.5 s of imports. So at most
    two groups live at once, the one in use and the next one starting or ready."""

    def __init__(self, tmp_path_factory, order: list[tuple] = ()):
        self._tmp = tmp_path_factory
        self._order = list(order)
        self._key: tuple | None = None
        self._group: Group | None = None
        self._users: list[str] = []
        self._next: tuple[tuple, threading.Thread, list] | None = None   # key, its start

    def get(self, module) -> Group:
        key = group_key(module)
        if self._group is None or key != self._key or not self._group.alive():
            self.close_current()
            self._group, self._key = self._take_started(key) or self._start(key), key
            self._prestart_after(key)
        self._users.append(module.__name__)
        return self._group

    def close_current(self) -> None:
        g, self._group, users, self._users = self._group, None, self._users, []
        if g is not None:
            check_stopped(g, who=f"the group of {', '.join(users)}: ")

    def close(self) -> None:
        self.close_current()
        started = self._take_started(None)
        if started is not None:
            check_stopped(started, who="a group started ahead and never used: ")

    def _start(self, key: tuple) -> Group:
        args, env = key
        return start_group(self._tmp.mktemp("group"), list(args), env=dict(env))

    def _prestart_after(self, key: tuple) -> None:
        """Start the group of the first other flags after `key` in the run's order."""
        later = self._order[self._order.index(key) + 1:] if key in self._order else []
        nxt = next((k for k in later if k != key), None)
        if nxt is None:
            return
        tmp, out = self._tmp.mktemp("group"), []   # mktemp on this thread, not the starter's

        def start():
            try:
                out.append(start_group(tmp, list(nxt[0]), env=dict(nxt[1])))
            except Exception as e:  # noqa: BLE001  (raised where the group is taken)
                out.append(e)
        t = threading.Thread(target=start, daemon=True)
        t.start()
        self._next = (nxt, t, out)

    def _take_started(self, key: tuple | None) -> Group | None:
        """The group started ahead if it is `key`'s (None: whichever it is); one started for
        other flags is stopped, checked. Raises what its start raised."""
        if self._next is None:
            return None
        nkey, thread, out = self._next
        self._next = None
        thread.join()
        if isinstance(out[0], Exception):
            raise out[0]
        if key is None or nkey == key:
            return out[0]
        check_stopped(out[0], who="a group started ahead for other flags: ")
        return None


def group_order(items) -> list[tuple]:
    """The group flags of `items`' modules, in run order."""
    keys: list[tuple] = []
    for item in items:
        if item.module and "group" in item.fixturenames:
            key = group_key(item.module)
            if not keys or keys[-1] != key:
                keys.append(key)
    return keys


@pytest.fixture(scope="session")
def group_pool(request, tmp_path_factory):
    pool = GroupPool(tmp_path_factory, group_order(request.session.items))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def group(request, group_pool) -> Group:
    """A group on the tiny preset; a test module sets GROUP_ARGS for other flags and
    GROUP_ENV for variables added to the group's environment. Modules with the same flags
    share one (GroupPool), and run one after another (pytest_collection_modifyitems). A
    module that ends its group leaves the next one a fresh one."""
    return group_pool.get(request.module)


def _module_name(item) -> str:
    return item.module.__name__ if item.module else item.nodeid


def pytest_collection_modifyitems(items) -> None:
    """Modules that share a group's flags move up to the first of them, keeping their order;
    every other module keeps its place."""
    first_of_module: dict[str, int] = {}
    keyed: dict[str, tuple] = {}
    for i, item in enumerate(items):
        name = _module_name(item)
        first_of_module.setdefault(name, i)
        if item.module and "group" in item.fixturenames:
            keyed.setdefault(name, group_key(item.module))
    anchor_of_key: dict[tuple, int] = {}
    for name in sorted(keyed, key=first_of_module.get):
        anchor_of_key.setdefault(keyed[name], first_of_module[name])

    def place(pair):
        i, item = pair
        name = _module_name(item)
        own = first_of_module[name]
        anchor = anchor_of_key[keyed[name]] if name in keyed else own
        return anchor, own, i

    items[:] = [item for _, item in sorted(enumerate(items), key=place)]


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "tool_venvs(*tools): the tool venvs a test uses, "
                            "installed in the background from the session's start")


def pytest_collection_finish(session) -> None:
    """The selected tests' tool venvs start installing now (tests/tool_venvs.py)."""
    if not session.config.option.collectonly:
        session.config.stash[TOOL_INSTALLS] = start_installs(session.items)


def pytest_sessionfinish(session) -> None:
    """No pip left running past the session (a run stopped early by -x, say)."""
    thread = session.config.stash.get(TOOL_INSTALLS, None)
    if thread is not None:
        thread.join()
