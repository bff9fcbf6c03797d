"""Reading a step log: its structure and every value checked on the way in (replay/rows.py),
so that damage is a DamagedLog naming the file, the place and the fault, never a traceback."""
from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager

from core.logrecords import (OPTIONAL_TABLES, READABLE_FORMATS, TABLES, EmbeddingRecord, Gap,
                             InputRecord, PromptLogprobsRecord, StepRecord, select_sql)

# logs made before these columns existed lack them
OPTIONAL_COLUMNS = {("requests", "user"), ("requests", "arrival_time"),
                    ("requests", "key_hash"), ("requests", "cache_salt")}
from replay.damage import DamagedLog, parsed
from replay.rows import (check_meta, embedding_row, gap_message, input_row, prompt_row,
                         request_row, step_row)

__all__ = ["DamagedLog", "LogFile", "StepRecord"]


def _connect(path: str) -> sqlite3.Connection:
    if not os.path.isfile(path):
        raise DamagedLog(f"{path}: no such file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise DamagedLog(f"{path}: not a step log (SQLite says: {e})") from None
    missing = set(TABLES) - set(OPTIONAL_TABLES) - names
    if missing:
        raise DamagedLog(f"{path}: not a step log (no table {', '.join(sorted(missing))})")
    return conn


class LogFile:
    def __init__(self, path: str):
        self.path = path
        self.conn = _connect(path)
        with self._reading():
            self._check_columns()
            self.meta = self._meta()
            self._check_format()
            self.bounds = check_meta(self.meta)
            self._check_gaps()
            self.requests = self._requests()
            self.inputs = self._inputs()

    @contextmanager
    def _reading(self):
        """Every fault found while reading, as one DamagedLog that names the file."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            raise DamagedLog(f"{self.path}: damaged step log (SQLite says: {e})") from None
        except DamagedLog as e:
            if str(e).startswith(f"{self.path}: "):
                raise
            raise DamagedLog(f"{self.path}: damaged step log: {e}") from None

    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check_columns(self) -> None:
        present = self._tables()
        for name, (columns, _) in TABLES.items():
            if name in OPTIONAL_TABLES and name not in present:
                continue
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({name})")}
            for col in columns:
                if col not in have and (name, col) not in OPTIONAL_COLUMNS:
                    raise DamagedLog(f"table {name} has no column {col}")

    def _meta(self) -> dict:
        meta = {}
        for key, value in self.conn.execute("SELECT key, value FROM meta"):
            meta[key] = parsed(value, f"meta {key!r}")
        return meta

    def _check_format(self) -> None:
        fmt = self.meta.get("format")
        if fmt is None:
            raise DamagedLog(f"{self.path}: truncated step log: its meta table has no format")
        if fmt not in READABLE_FORMATS:
            raise DamagedLog(f"{self.path}: step log format {fmt}; this replay reads formats"
                             f" {', '.join(map(str, READABLE_FORMATS))}")

    def _check_gaps(self) -> None:
        if "gaps" not in self._tables():
            return  # a log from before gaps were recorded
        row = self.conn.execute(select_sql(Gap)).fetchone()
        if row is not None:
            raise DamagedLog(f"{self.path}: incomplete step log: {gap_message(*row)}")

    def _requests(self) -> dict[int, dict]:
        cur = self.conn.execute("SELECT * FROM requests ORDER BY id")
        cols = [c[0] for c in cur.description]
        out = {}
        for row in cur:
            r = request_row(dict(zip(cols, row)), self.bounds)
            out[r["id"]] = r
        return out

    def _inputs(self) -> dict[int, list[tuple[str, int | None]]]:
        out: dict[int, list] = {}
        for row in self.conn.execute(select_sql(InputRecord)):
            step, kind, seq_id = input_row(*row, self.requests)
            out.setdefault(step, []).append((kind, seq_id))
        return out

    def num_steps(self) -> int:
        with self._reading():
            return self.conn.execute("SELECT count(*) FROM steps").fetchone()[0]

    def steps(self):
        """Every StepRecord in step order."""
        with self._reading():
            for row in self.conn.execute(select_sql(StepRecord)):
                yield step_row(row, self.requests, self.bounds)

    def check_steps(self) -> None:
        """Read every step (a damaged one raises DamagedLog): before loading a model that
        would only run until the damage."""
        for _ in self.steps():
            pass

    def prompt_logprobs(self) -> dict[int, dict[int, tuple[int, list]]]:
        """step -> {seq_id: (first position, entries)}; {} for a log from before prompt
        logprobs (no such table)."""
        out: dict[int, dict] = {}
        if PromptLogprobsRecord.table not in self._tables():
            return out
        with self._reading():
            for row in self.conn.execute(select_sql(PromptLogprobsRecord)):
                r = prompt_row(row, self.requests, self.bounds)
                out.setdefault(r.step, {})[r.request_id] = (r.first, r.entries)
        return out

    def embeddings(self) -> dict[int, dict[int, tuple[int, str]]]:
        """step -> {seq_id: (dims, sha256)}; {} for a log from before embeddings."""
        out: dict[int, dict] = {}
        if EmbeddingRecord.table not in self._tables():
            return out
        with self._reading():
            for row in self.conn.execute(select_sql(EmbeddingRecord)):
                r = embedding_row(row, self.requests)
                out.setdefault(r.step, {})[r.request_id] = (r.dims, r.sha256)
        return out

    def version_warnings(self) -> list[str]:
        from core.config import package_versions
        logged, here = self.meta.get("versions", {}), package_versions()
        return [f"log made with {k} {logged.get(k)}, replaying with {here[k]}"
                for k in ("torch", "transformers") if logged.get(k) != here[k]]

    def close(self) -> None:
        self.conn.close()
