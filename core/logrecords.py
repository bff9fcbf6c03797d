"""The step log's schema: one dataclass per table, its rows as records.

A record's fields, in order, are its table's columns (names and order pinned, docs/design/steplog.md
"Step log columns"); a field's annotation is its column's type, and `json_column()` marks
a value stored as JSON text. Everything else derives from the class: core/steplog.py makes
the tables from `columns`, core/logsql.py writes a record with `insert_sql` and `values`,
and replay (replay/logfile.py, replay/rows.py) reads with `select_sql` and builds the same
class back, so that a column is named here once. `TABLES` is the whole schema.

The column names are the log's, not the code's: requests.id, inputs.request_id and
prompt_logprobs.request_id hold the scheduler's seq_id (requests.client_request_id the
client's request_id).

No imports beyond the standard library: the engine, the writer thread and replay all use it.
"""
import json
from dataclasses import dataclass, field, fields
from functools import cache
from types import UnionType
from typing import ClassVar

_JSON, _CLOCK = "json", "clock"

# The step log's format: bump it when the tables or the state hash change meaning.
# 3: the state hash takes block tables through core/table_growth.py; 2: whole, every step.
FORMAT = 3
READABLE_FORMATS = (2, 3)


def json_column():
    """A field stored as JSON text (a dict or list in the record)."""
    return field(metadata={_JSON: True})


# A clock column holds Unix seconds (wall times) or milliseconds (durations), which stay in
# [0, MAX_CLOCK) (2**32 s is the year 2106; 2**32 ms, 50 days a step); replay holds a log
# to it (a clock of 1e300 overflowed the what-if fit).
MAX_CLOCK = 2.0 ** 32


def clock_column():
    """A field that says when or how long, not what happened: two runs of the same
    inputs differ in it (replay/diff.py ignores it)."""
    return field(metadata={_CLOCK: True})


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A request, written in two parts (core/logsql.py): every column but FINISH at
    admission, FINISH when it ends (NULL until then). Logs made before `user`,
    `arrival_time`, `key_hash` and `cache_salt` existed lack those columns (replay/logfile.py reads them
    as NULL)."""
    table: ClassVar[str] = "requests"
    key: ClassVar[str] = "id"
    FINISH: ClassVar[tuple] = ("finish_step", "finish_reason", "output_tokens")

    id: int
    client_request_id: str
    arrival_step: int
    prompt_tokens: list = json_column()
    max_tokens: int
    priority: int
    sampling: dict = json_column()    # the SamplingParams fields and ignore_eos
    finish_step: int | None
    finish_reason: str | None
    output_tokens: list | None = json_column()
    user: str | None
    arrival_time: float | None        # wall clock when the core read the request
    key_hash: str | None              # the API key's short hash (never the key), or NULL
    cache_salt: str | None            # the digest the frontend sent (never a raw salt)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step (schedule -> forward -> on_step). schedule: {"prefill": [[seq_id, start,
    length, last], ...], "decode": [seq_ids], "preempted": [seq_ids]}; outputs: [[seq_id,
    token, stop], ...] in the worker's row order (empty for an abandoned step)."""
    table: ClassVar[str] = "steps"
    key: ClassVar[str] = "step"

    step: int
    wall_time: float = clock_column()
    duration_ms: float = clock_column()   # plan to commit
    schedule: dict = json_column()
    outputs: list = json_column()
    free_blocks: int
    running: int
    waiting: int
    hash: str


@dataclass(frozen=True, slots=True)
class InputRecord:
    """An external input, applied before step `step` (the seq-th of them there); kind
    "add" | "abort" | "restart"; request_id is the seq_id (None for a restart)."""
    table: ClassVar[str] = "inputs"
    key: ClassVar[tuple] = ("step", "seq")

    step: int
    seq: int
    kind: str
    request_id: int | None


@dataclass(frozen=True, slots=True)
class PromptLogprobsRecord:
    """Prompt logprobs step `step` delivered to request request_id (its seq_id): its prompt
    positions first, first + 1, ..., each entry [logprob, rank, [[token id, logprob], ...]]
    (docs/design/worker.md, "Prompt logprobs"). Logs made before prompt logprobs existed lack this
    table; readers take its absence for none."""
    table: ClassVar[str] = "prompt_logprobs"
    key: ClassVar[tuple] = ("step", "request_id")

    step: int
    request_id: int
    first: int
    entries: list = json_column()


@dataclass(frozen=True, slots=True)
class EmbeddingRecord:
    """The vector step `step` pooled for embedding request request_id (its seq_id), as its
    length and the sha256 of its little-endian float32 bytes (docs/design/worker.md,
    "Embeddings"); replay --with-model checks the digest. Logs made before embeddings
    existed lack this table; readers take its absence for none."""
    table: ClassVar[str] = "embeddings"
    key: ClassVar[tuple] = ("step", "request_id")

    step: int
    request_id: int
    dims: int
    sha256: str


@dataclass(slots=True)
class Gap:
    """Steps first_step..last_step, and the inputs and finishes queued with them, were
    dropped (--log-errors serve, the log unwritable for too long). Grows while it lasts.
    Logs made before gaps existed lack this table; readers take its absence for no gaps."""
    table: ClassVar[str] = "gaps"
    key: ClassVar[str] = "first_step"

    first_step: int
    last_step: int
    records: int
    reason: str


def is_json(f) -> bool:
    return f.metadata.get(_JSON, False)


def is_clock(f) -> bool:
    return f.metadata.get(_CLOCK, False)


def _sql_type(f) -> type:
    if is_json(f):
        return str
    if isinstance(f.type, UnionType):  # int | None: a column that may hold NULL
        (t,) = (a for a in f.type.__args__ if a is not type(None))
        return t
    return f.type


def columns(cls) -> dict[str, type]:
    """The table's columns and their types, in order (for sqlite_utils' create)."""
    return {f.name: _sql_type(f) for f in fields(cls)}


def column_list(cls) -> str:
    """"a, b, c": the columns, in order, for a SELECT or an INSERT."""
    return ", ".join(f.name for f in fields(cls))


@cache
def select_sql(cls) -> str:
    """Every row of the table, in key order."""
    key = (cls.key,) if isinstance(cls.key, str) else cls.key
    return f"SELECT {column_list(cls)} FROM {cls.table} ORDER BY {', '.join(key)}"


@cache
def insert_sql(cls) -> str:
    n = len(fields(cls))
    return f"INSERT INTO {cls.table} ({column_list(cls)}) VALUES ({','.join('?' * n)})"


@cache
def _encoders(cls) -> tuple:
    return tuple((f.name, json.dumps if is_json(f) else None) for f in fields(cls))


def values(record) -> tuple:
    """The record as the row `insert_sql` takes (JSON columns encoded)."""
    return tuple(getattr(record, name) if enc is None else enc(getattr(record, name))
                 for name, enc in _encoders(type(record)))


# The run's meta: one row per key, its value as JSON (core/config.py log_meta).
META = {"key": str, "value": str}
# Every table: (its columns and types, its primary key). Logs made before gaps or prompt
# logprobs existed lack those tables; readers take their absence for none.
TABLES = {"meta": (META, "key"),
          **{r.table: (columns(r), r.key)
             for r in (RequestRecord, InputRecord, StepRecord, Gap, PromptLogprobsRecord,
                       EmbeddingRecord)}}
OPTIONAL_TABLES = (Gap.table, PromptLogprobsRecord.table, EmbeddingRecord.table)


def admission_sql() -> str:
    """The INSERT of a request at admission: every column but RequestRecord.FINISH."""
    cols = [f.name for f in fields(RequestRecord) if f.name not in RequestRecord.FINISH]
    return f"INSERT INTO requests ({', '.join(cols)}) VALUES ({','.join('?' * len(cols))})"


def finish_sql() -> str:
    """The UPDATE of a request at its finish: RequestRecord.FINISH, then its id."""
    return f"UPDATE requests SET {'=?, '.join(RequestRecord.FINISH)}=? WHERE id=?"
