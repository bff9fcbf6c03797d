"""The stored /v1/responses replies (`store`, `previous_response_id`, GET /v1/responses/{id}):
one SQLite file, bounded in count and age, each row readable only by the API key that made
it (docs/http.md, "/v1/responses").

A row holds the response object as answered and its conversation's items (the input it was
given, previous_response_id's items included, then its output), which a later request that
names it continues from. The bound is kept on every write: rows older than `max_age_s` go,
then the oldest past `max_count`; a read never returns an expired row. The owner is the
admitted key's short hash (identity.py); without keys every caller is one owner (""). An id
of another owner reads exactly as an unknown one, so a key learns nothing of others'.

The file is opened on the first use, so a gateway nobody asks to store leaves none. Calls
are made on the gateway's event loop: each is one indexed statement on a bounded table.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field

DEFAULT_MAX_COUNT = 1000
DEFAULT_MAX_AGE_S = 24 * 3600.0
MEMORY = ":memory:"

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created REAL NOT NULL,
    response TEXT NOT NULL,
    items TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""


def add_store_args(group, default: str | None, where: str) -> None:
    """The store's flags on an argparse group (the gateway's and serve's); `where` says
    the default file."""
    group.add_argument("--responses-store", default=default, metavar="FILE",
                       help=f"SQLite file of stored /v1/responses replies ({where})")
    group.add_argument("--responses-max", type=int, default=DEFAULT_MAX_COUNT,
                       help="stored responses kept at most (the oldest are evicted)")
    group.add_argument("--responses-max-age", type=float, default=DEFAULT_MAX_AGE_S,
                       help="seconds a stored response is kept")


@dataclass
class Stored:
    response: dict   # the response object as it was answered
    items: list      # its conversation: input items, then output items


@dataclass
class ResponsesStore:
    path: str = MEMORY
    max_count: int = DEFAULT_MAX_COUNT
    max_age_s: float = DEFAULT_MAX_AGE_S
    clock: object = time.time
    _db: sqlite3.Connection | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.max_count < 1 or self.max_age_s <= 0:
            raise ValueError("the responses store needs max_count >= 1 and max_age_s > 0")

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.executescript(SCHEMA)
        return self._db

    def put(self, owner: str, response: dict, items: list) -> None:
        """Keeps `response` for `owner`, then evicts what is past the bound."""
        now = self.clock()
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                            (response["id"], owner, now, json.dumps(response),
                             json.dumps(items)))
            self._evict(now)

    def _evict(self, now: float) -> None:
        self.db.execute("DELETE FROM responses WHERE created < ?", (now - self.max_age_s,))
        self.db.execute("DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses "
                        "ORDER BY created DESC, rowid DESC LIMIT ?)", (self.max_count,))

    def get(self, owner: str, response_id: str) -> Stored | None:
        """`owner`'s response of that id, None when unknown, expired or another's."""
        row = self.db.execute("SELECT response, items FROM responses WHERE id = ? AND "
                              "owner = ? AND created >= ?",
                              (response_id, owner, self.clock() - self.max_age_s)).fetchone()
        return None if row is None else Stored(json.loads(row[0]), json.loads(row[1]))

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
