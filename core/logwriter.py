"""The step log's writer thread: commits queued batches in order and never dies of an error.

A batch that fails is rolled back and retried every `retry_s` until it commits; later
batches wait behind it in the queue, so the file always holds a prefix of the run and
`problem` says meanwhile why nothing is written. Every `check_s` the writer makes sure its
file is still at its path (core/logfiles.py copies the log back, or beside a file that
replaced it). After commits it checkpoints the WAL every `checkpoint_s`, so that the .db
file alone (copied without its -wal, or after a kill -9 and a lost -wal) holds nearly
every committed step; the checkpoint runs here, off the step loop.
"""
from __future__ import annotations

import queue
import sqlite3
import sys
import threading
import time

from core.logfiles import moved, open_log, relocate
from core.logsql import write_batch

RETRY_S = 0.5
CHECK_S = 1.0
CHECKPOINT_S = 1.0
CLOSE_GRACE_S = 2.0   # how long close() lets a failing batch retry before giving it up
_STOP = object()


def say(msg: str) -> None:
    print(f"[steplog] {msg}", file=sys.stderr, flush=True)


class _Every:
    def __init__(self, period: float):
        self.period, self.next = period, time.monotonic()

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.period
        return True


class Writer:
    def __init__(self, path: str, checkpoint_s: float = CHECKPOINT_S, check_s: float = CHECK_S,
                 retry_s: float = RETRY_S):
        self.path = path
        self.written = 0       # records committed; only the writer thread adds
        self.checkpoints = 0
        self._write_error: str | None = None
        self._file_error: str | None = None
        self._checkpoint_error: str | None = None
        self._since = 0.0      # when the current problem began
        self._checkpoint_s, self._check_s, self._retry_s = checkpoint_s, check_s, retry_s
        self._close_by = float("inf")
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._log = open_log(path)
        self._thread = threading.Thread(target=self._run, name="steplog", daemon=True)
        self._thread.start()

    @property
    def problem(self) -> str | None:
        return self._file_error or self._write_error

    @property
    def conn(self) -> sqlite3.Connection:
        return self._log.conn

    def put(self, batch: list, records: int) -> None:
        self._q.put((batch, records))

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        self._close_by = time.monotonic() + grace
        self._q.put(_STOP)
        self._thread.join()

    # ---- the thread

    def _run(self) -> None:
        check, checkpoint = _Every(self._check_s), _Every(self._checkpoint_s)
        dirty = False
        while True:
            try:
                item = self._q.get(timeout=self._check_s)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if item is not None:
                if not self._commit(*item):
                    self._abandon(item[1])
                    break
                dirty = True
            now = time.monotonic()
            if check.due(now):
                self._check_file()
            if dirty and checkpoint.due(now):
                self._checkpoint()
                dirty = False
        self._log.conn.close()

    def _commit(self, batch: list, records: int) -> bool:
        """Retry until `batch` commits; False only when closing and out of time."""
        while True:
            try:
                write_batch(self._log.conn, batch)
            except Exception as e:  # noqa: BLE001 - whatever it is, retry and say so
                self._report("_write_error", f"step log: {e}")
            else:
                self.written += records
                self._report("_write_error", None)
                return True
            if self._check_file():
                continue
            if time.monotonic() > self._close_by:
                return False
            time.sleep(self._retry_s)

    def _check_file(self) -> bool:
        """True when the log moved to a new file (its own was removed or replaced)."""
        try:
            how = moved(self.path, self._log)
        except OSError:  # the folder cannot be read: the open file still takes writes
            how = None
        if how is None:
            self._report("_file_error", None)
            return False
        old = self.path
        try:
            self.path, self._log = relocate(self._log, old, how)
        except (OSError, sqlite3.Error) as e:
            self._report("_file_error", f"step log file was {how} and cannot be restored: {e}")
            return False
        n = _count_steps(self._log.conn)
        if how == "removed" and self.path == old:
            say(f"{old} was removed while in use; restored it there ({n} steps) from the"
                " open connection; logging goes on in it")
        else:
            say(f"{old} was {how} while in use; that path is left alone; the log ({n} steps)"
                f" goes on in {self.path}")
        self._report("_file_error", None)
        return True

    def _checkpoint(self) -> None:
        try:
            self._log.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as e:  # the WAL still holds every commit: not a problem
            if str(e) != self._checkpoint_error:
                say(f"checkpoint of {self.path} failed: {e}; the -wal file holds the commits")
            self._checkpoint_error = str(e)
        else:
            self._checkpoint_error = None

    def _report(self, which: str, error: str | None) -> None:
        """Set one of the two problems; say loudly when `problem` changes."""
        before = self.problem
        setattr(self, which, error)
        after = self.problem
        if after == before:
            return
        now = time.monotonic()
        if after is None:
            say(f"writing {self.path} again after {now - self._since:.1f}s")
            return
        if before is None:
            self._since = now
        say(f"{after} ({self.path}); retrying every {self._retry_s:g}s while new records"
            " wait in memory")

    def _abandon(self, records: int) -> None:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                records += item[1]
        say(f"closing with {records} records not written to {self.path}: {self.problem}")


def _count_steps(conn: sqlite3.Connection) -> int | str:
    try:
        return conn.execute("SELECT count(*) FROM steps").fetchone()[0]
    except sqlite3.Error:
        return "?"
