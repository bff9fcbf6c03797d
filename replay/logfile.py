"""Reading a step log: validation with clear errors, then typed access to its tables."""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass

from core.steplog import FORMAT, SCHEMA


class LogError(Exception):
    """A file that cannot be read as a step log; the message says why."""


@dataclass
class StepRow:
    step: int
    wall_time: float
    duration_ms: float
    schedule: dict
    outputs: list
    free_blocks: int
    running: int
    waiting: int
    hash: str


def _connect(path: str) -> sqlite3.Connection:
    if not os.path.isfile(path):
        raise LogError(f"{path}: no such file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise LogError(f"{path}: not a step log (SQLite says: {e})") from None
    missing = set(SCHEMA) - names
    if missing:
        raise LogError(f"{path}: not a step log (no table {', '.join(sorted(missing))})")
    return conn


class LogFile:
    def __init__(self, path: str):
        self.path = path
        self.conn = _connect(path)
        try:
            self.meta = {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}
            self._check_format()
            self.requests = self._requests()
            self.inputs = self._inputs()
        except sqlite3.DatabaseError as e:
            raise LogError(f"{path}: damaged step log (SQLite says: {e})") from None

    def _check_format(self) -> None:
        fmt = self.meta.get("format")
        if fmt is None:
            raise LogError(f"{self.path}: truncated step log: its meta table is empty")
        if fmt != FORMAT:
            raise LogError(f"{self.path}: step log format {fmt}; this replay reads format {FORMAT}")

    def _requests(self) -> dict[int, dict]:
        cur = self.conn.execute("SELECT * FROM requests ORDER BY id")
        cols = [c[0] for c in cur.description]
        out = {}
        for row in cur:
            r = dict(zip(cols, row))
            for k in ("prompt_tokens", "sampling", "output_tokens"):
                r[k] = json.loads(r[k]) if r[k] is not None else None
            out[r["id"]] = r
        return out

    def _inputs(self) -> dict[int, list[tuple[str, int | None]]]:
        out: dict[int, list] = {}
        for step, kind, rid in self.conn.execute(
                "SELECT step, kind, request_id FROM inputs ORDER BY step, seq"):
            out.setdefault(step, []).append((kind, rid))
        return out

    def num_steps(self) -> int:
        return self.conn.execute("SELECT count(*) FROM steps").fetchone()[0]

    def steps(self):
        """Every StepRow in step order."""
        try:
            for row in self.conn.execute("SELECT step, wall_time, duration_ms, schedule, outputs,"
                                         " free_blocks, running, waiting, hash FROM steps"
                                         " ORDER BY step"):
                yield StepRow(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4]),
                              *row[5:])
        except sqlite3.DatabaseError as e:
            raise LogError(f"{self.path}: damaged step log (SQLite says: {e})") from None

    def version_warnings(self) -> list[str]:
        from core.config import package_versions
        logged, here = self.meta.get("versions", {}), package_versions()
        return [f"log made with {k} {logged.get(k)}, replaying with {here[k]}"
                for k in ("torch", "transformers") if logged.get(k) != here[k]]

    def close(self) -> None:
        self.conn.close()
