"""The step log's file on disk: opening it, noticing that it left its path, and putting
the log back from the writer's still-open connection.

SQLite goes on writing into a file that was removed or renamed away (it holds it open), so
nothing committed is lost while that connection lives; the online backup API copies every
committed page out of it, to the original path when that is free, else to a sibling
(`<stem>.recovered.db`), never over another file.
"""
from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

SIDECARS = ("-wal", "-shm")
MAX_SIBLINGS = 100


@dataclass(frozen=True)
class OpenLog:
    conn: sqlite3.Connection
    db: tuple | None               # (st_dev, st_ino) of the file opened
    sidecars: dict[str, tuple | None]  # "-wal", "-shm": the files this connection made


def file_id(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def open_log(path: str) -> OpenLog:
    """A connection for the writer thread (explicit transactions, see core/logsql.py)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # makes -wal and -shm
    return OpenLog(conn, file_id(path), {s: file_id(path + s) for s in SIDECARS})


def moved(path: str, log: OpenLog) -> str | None:
    """'removed' or 'replaced' when `path` no longer names the file `log` has open."""
    now = file_id(path)
    if now is None:
        return "removed"
    return "replaced" if now != log.db else None


def sibling(path: str, n: int) -> str:
    p = Path(path)
    tag = ".recovered" if n == 1 else f".recovered-{n}"
    return str(p.with_name(p.stem + tag + (p.suffix or ".db")))


def relocate(log: OpenLog, path: str, how: str) -> tuple[str, OpenLog]:
    """Copy the log out of `log` (its file `how`: removed or replaced) to a free path;
    returns that path and a connection to it. `log` is closed only once the copy is open."""
    tmp = _backup(log.conn, os.path.dirname(path) or ".")
    try:
        candidates = ([path] if how == "removed" else []) + [
            sibling(path, n) for n in range(1, MAX_SIBLINGS)]
        target = _link_to_free(tmp, candidates)
    finally:
        os.unlink(tmp)
    # The old connection's -wal and -shm still sit at path's; SQLite would read them as
    # the new file's (or the replacing file's) own. They are ours: remove them first.
    _remove_own_sidecars(path, log.sidecars)
    new = open_log(target)
    log.conn.close()
    return target, new


def _backup(conn: sqlite3.Connection, folder: str) -> str:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".steplog-", suffix=".restoring")  # 0600
    os.close(fd)
    try:
        dst = sqlite3.connect(tmp)
        try:
            conn.backup(dst)
        finally:
            dst.close()
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _link_to_free(src: str, candidates: list[str]) -> str:
    for target in candidates:
        try:
            os.link(src, target)  # unlike rename, never replaces a file that is there
            return target
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name beside {candidates[-1]}")


def _remove_own_sidecars(path: str, own: dict[str, tuple | None]) -> None:
    for suffix, fid in own.items():
        if fid is not None and file_id(path + suffix) == fid:
            os.unlink(path + suffix)
