"""The frontend's tokenizing, off its loop: one thread, one queue per client, clients served
fairly by the time their jobs take.

A text prompt is tokenized (and its ids checked) by the thread, and a constraint compiled
there (prompts.py); the `tokenizers` library and llguidance let go of the GIL while they
work, so the loop goes on forwarding everyone's tokens. The
queues are served by start-time fair queuing: a job starts (virtually) when its client's
previous one finishes, or at the start of the job in service if that is later, and
finishes its cost later; the earliest start goes next, the earliest finish among equal
starts. A job's cost is guessed from its prompt's length (EST_S_PER_CHAR) when it is queued,
and what it took past that guess (a slow compile: docs/structured.md, "The compile budget")
is charged to its client once it ran: the client's later jobs start that much later. A short
prompt from a client that has used little is therefore next, however many long prompts or
slow compiles others queued: it waits for the job in service only, and a client that used
much waits behind those that used little. Before a prompt is queued
the loop has refused one that cannot fit (token_bound.py), so one prompt is at most
L x max_model_len bytes of work, and each queued prompt counts toward its client's
--max-inflight-per-client: what one client can queue is bounded.

The loop owns the jobs by key (submit, cancel, drop, done); the thread sees only the queues
and the finished list, under the lock, and calls `notify` (the loop's Wakeup) after each job.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from core.ipc.protocol import Generate

log = logging.getLogger("frontend")

EST_S_PER_CHAR = 1e-6   # a job's guessed cost a character (tokenizers run at megabytes a second)
PRUNE_FROM = 1024       # clients' last finishes kept before those in the past go


@dataclass
class Job:
    ident: bytes
    msg: Generate
    ids: list[int] | None = None
    error: Exception | None = None   # InvalidField (a 400) or what the tokenizer raised
    salt: str | None = None          # the digest of its salts, taken on arrival (cache_salt.py)

    @property
    def key(self) -> tuple[bytes, str]:
        return self.ident, self.msg.request_id


class TokenizeQueue:
    def __init__(self, tokenize: Callable[[bytes, Generate], list[int]],
                 notify: Callable[[], None], clock: Callable[[], float] = time.perf_counter,
                 name: str = "tokenize"):
        """`tokenize(ident, msg)`: the prompt's checked ids, or raises; runs on the thread.
        `clock`: read on the thread only (time.thread_time charges the thread's own CPU
        time)."""
        self._tokenize, self._notify, self._clock = tokenize, notify, clock
        self._cv = threading.Condition()
        self._queues: dict[bytes, deque[tuple[float, float, Job]]] = {}   # (start, finish, job)
        self._last: dict[bytes, float] = {}   # each client's last finish (virtual seconds)
        self._prune_at = PRUNE_FROM
        self._vtime = 0.0   # the start of the job in service
        self._finished: list[Job] = []
        self._closed = False
        self._jobs: dict[tuple[bytes, str], Job] = {}   # the loop's: queued or running
        self._per_client: dict[bytes, int] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the loop's side

    def submit(self, ident: bytes, msg: Generate, salt: str | None = None) -> None:
        job = Job(ident, msg, salt=salt)
        self._jobs[job.key] = job
        self._per_client[ident] = self._per_client.get(ident, 0) + 1
        with self._cv:
            start = max(self._last.get(ident, 0.0), self._vtime)
            self._last[ident] = start + guess(msg)
            self._queues.setdefault(ident, deque()).append((start, self._last[ident], job))
            self._cv.notify()

    def has(self, ident: bytes, request_id: str) -> bool:
        return (ident, request_id) in self._jobs

    def count_of(self, ident: bytes) -> int:
        return self._per_client.get(ident, 0)

    def __len__(self) -> int:
        return len(self._jobs)

    def cancel(self, ident: bytes, request_id: str) -> Job | None:
        """Forget a job (its result, if it comes, is dropped); the job, or None."""
        job = self._jobs.pop((ident, request_id), None)
        if job is not None:
            self._forget(job)
            with self._cv:
                queue = self._queues.get(ident, ())
                for entry in [e for e in queue if e[2] is job]:
                    queue.remove(entry)
                if not queue:
                    self._queues.pop(ident, None)
        return job

    def drop(self, ident: bytes) -> list[Job]:
        """Cancel every job of a client."""
        return [self.cancel(ident, rid) for i, rid in list(self._jobs) if i == ident]

    def drop_all(self) -> list[Job]:
        return [self.cancel(i, rid) for i, rid in list(self._jobs)]

    def done(self) -> list[Job]:
        """The finished jobs not cancelled meanwhile, in the order they finished."""
        with self._cv:
            finished, self._finished = self._finished, []
        out = [j for j in finished if self._jobs.get(j.key) is j]
        for job in out:
            del self._jobs[job.key]
            self._forget(job)
        return out

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(5)

    def _forget(self, job: Job) -> None:
        left = self._per_client.pop(job.ident) - 1
        if left:
            self._per_client[job.ident] = left

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while (job := self._next()) is not None:
            began = self._clock()
            try:
                job.ids = self._tokenize(job.ident, job.msg)
            except Exception as e:  # noqa: BLE001  (the loop answers it)
                job.error = e
            with self._cv:
                self._charge(job.ident, self._clock() - began - guess(job.msg))
                self._finished.append(job)
            self._notify()

    def _charge(self, ident: bytes, extra: float) -> None:
        """A job took `extra` seconds past its guess: its client's later jobs start later
        (under the lock)."""
        if extra <= 0:
            return
        self._last[ident] = self._last.get(ident, self._vtime) + extra
        queue = self._queues.get(ident)
        if queue:
            self._queues[ident] = deque((s + extra, f + extra, j) for s, f, j in queue)

    def _next(self) -> Job | None:
        """The queued job that starts first (each client's first does, of its own)."""
        with self._cv:
            while not self._queues and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            ident = min(self._queues, key=lambda i: self._queues[i][0][:2])
            queue = self._queues[ident]
            self._vtime, _, job = queue.popleft()
            if not queue:
                del self._queues[ident]
            if len(self._last) > self._prune_at:
                self._prune()
            return job

    def _prune(self) -> None:
        """Forget the last finishes in the past (a client without one starts now)."""
        for ident in [i for i, f in self._last.items() if f <= self._vtime]:
            del self._last[ident]
        self._prune_at = max(PRUNE_FROM, 2 * len(self._last))


def guess(msg: Generate) -> float:
    """A job's cost before it runs: its prompt's length (characters, or ids)."""
    return (len(msg.prompt) + 1) * EST_S_PER_CHAR
