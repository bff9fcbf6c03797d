"""Prompts: the frontend's preparation of a Generate: the model's tokenizer, the checks
against the model, and the queue that tokenizes off the loop (frontend/tokenizing.py).

A text prompt is checked for size on the loop, then turned into ids on the tokenizing
thread. A constraint the frontend has no verdict for is compiled first, for a thread of its own
by a child process at a lower CPU priority (compile_process.py; bounded in CPU time,
remembered by key: compile_check.py; a new one within its client's budget:
constraint_budget.py), then the job goes on to the tokenizing
thread: a compile flood neither holds up other clients' prompts nor takes a core from the
worker's step (docs/structured.md, "The compile budget"). Ids given are checked on the
loop. The Frontend (frontend/process.py) asks `prepare`, admits what `done` yields, and
builds each request's state here (its decoders and stop ids come from the tokenizer).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from core.ipc.protocol import Delta, Generate, ModelInfo
from frontend.compile_check import CompileCheck
from frontend.compile_process import CompileChildren
from frontend.constraint_budget import ConstraintBudget
from frontend.replies import Replies
from frontend.request import RequestState
from frontend.structured import check_constraint, constraint_of
from frontend.token_bound import check_prompt_text
from frontend.tokenizer import Tokenizer
from frontend.tokenizing import Job, TokenizeQueue
from frontend.validate import InvalidField, check_params, check_prompt_ids

log = logging.getLogger("frontend")


class Prompts:
    def __init__(self, max_compile_ms: int, new_constraints_per_s: float,
                 notify: Callable[[], None], replies: Replies):
        """`notify`: called on the tokenizing thread after each job (the loop's Wakeup)."""
        self._info: ModelInfo | None = None
        self._tokenizer: Tokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._replies = replies
        # both threads' (each locks itself): the compile thread compiles, the tokenizing
        # thread finds the verdict kept (or, evicted meanwhile, compiles it again)
        self._children = CompileChildren(max_compile_ms)
        self._compiles = CompileCheck(max_compile_ms, run=self._children.compile)
        self._budget = ConstraintBudget(new_constraints_per_s)
        self._queue = TokenizeQueue(self._tokenize, notify)
        # a job here is charged its compile's CPU time (its child's) on the fair queue
        self._compile_queue = TokenizeQueue(
            self._compile, notify, name="compile",
            clock=lambda: time.thread_time() + self._children.cpu_s())
        self._queues = (self._queue, self._compile_queue)

    # ------------------------------------------------------------ the model

    @staticmethod
    def preload() -> None:
        """Import transformers ahead of the model (while the cores are still starting)."""
        Tokenizer.preload()

    def load(self, info: ModelInfo) -> None:
        """The model's tokenizer; raises what loading it raised (then never `ready`)."""
        self._info, self._eos_ids = info, frozenset(info.eos_ids)
        self._tokenizer = Tokenizer.load(info.tokenizer)

    @property
    def ready(self) -> bool:
        return self._tokenizer is not None

    # ------------------------------------------------------------ on the loop

    def check_params(self, msg: Generate) -> None:
        """InvalidField for a parameter the model cannot take."""
        check_params(msg, self._info)

    def prepare(self, ident: bytes, msg: Generate, salt: str | None) -> list[int] | None:
        """The prompt's ids, to admit now; None: queued for the tokenizing thread (its
        result comes out of `done`). InvalidField for a prompt that cannot fit. `salt`: the
        digest of its salts (frontend/cache_salt.py), taken on arrival."""
        # its shape and size here; compiled off the loop (docs/structured.md)
        constraint = constraint_of(msg.response_format, msg.structured_outputs)
        fit = msg.max_tokens if msg.max_tokens_must_fit else None
        if isinstance(msg.prompt, str):   # tokenized off the loop, then out of `done`
            check_prompt_text(self._tokenizer.bound, msg.prompt, self._info.max_model_len, fit)
        else:
            check_prompt_ids(msg.prompt, self._info, fit)
            if constraint is None:
                return msg.prompt
        new = constraint is not None and not self._compiles.cached(constraint)
        (self._compile_queue if new else self._queue).submit(ident, msg, salt)
        return None

    def done(self) -> Iterator[Job]:
        """Every prompt the thread has finished: a failed one answered here, the rest
        yielded to be admitted (or refused, if the cores died meanwhile)."""
        for job in self._compile_queue.done():   # compiled: on to be tokenized
            if job.error is None:
                self._queue.submit(job.ident, job.msg, job.salt)
            else:
                self._answer(job)
        for job in self._queue.done():
            if job.error is None:
                yield job
            else:
                self._answer(job)

    def _answer(self, job: Job) -> None:
        """A failed job's error reply."""
        rid = job.msg.request_id
        if isinstance(job.error, InvalidField):
            self._replies.error(job.ident, rid, job.error.code, str(job.error), job.error.field)
        else:
            log.error("tokenizing request %r failed: %r", rid, job.error)
            self._replies.error(job.ident, rid, 500, "the tokenizer failed on this prompt")

    def state(self, ident: bytes, msg: Generate, ids, fid: int) -> RequestState:
        """A new request's state: its decoders, stop strings and stop ids."""
        stop_ids = frozenset(msg.stop_token_ids or ())
        if not msg.ignore_eos:
            stop_ids |= self._eos_ids
        tok = self._tokenizer
        return RequestState(ident, msg.request_id, fid, list(ids),
                            tok.decoder(msg.skip_special_tokens),
                            list(msg.stop or ()), stop_ids, msg.include_stop_str_in_output,
                            msg.min_tokens, msg.max_tokens,
                            prompt_logprobs=msg.prompt_logprobs is not None,
                            detok=tok.detokenizer(msg.skip_special_tokens, ids),
                            embed=msg.embed)

    # ------------------------------------------------------------ the queue

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues)

    def has(self, ident: bytes, request_id: str) -> bool:
        return any(q.has(ident, request_id) for q in self._queues)

    def count_of(self, ident: bytes) -> int:
        return sum(q.count_of(ident) for q in self._queues)

    def abort(self, ident: bytes, request_id: str) -> None:
        """The client's Abort of a prompt still queued: its final abort reply."""
        self._abort_pending([q.cancel(ident, request_id) for q in self._queues])

    def abort_all(self) -> None:
        self._abort_pending([job for q in self._queues for job in q.drop_all()])

    def drop(self, ident: bytes) -> None:
        """A gone client's queued prompts, without a reply."""
        for q in self._queues:
            q.drop(ident)

    def close(self) -> None:
        for q in self._queues:
            q.close()
        self._children.close()

    def _abort_pending(self, jobs: list[Job | None]) -> None:
        """Each cancelled job's final reply, as an aborted request's (no tokens yet)."""
        for job in filter(None, jobs):
            self._replies.aborted(job.ident, Delta(job.msg.request_id, "", [], "abort"))

    # ------------------------------------------------------------ on the thread

    def _compile(self, ident: bytes, msg: Generate) -> None:
        """On the compile thread: the constraint compiled, a new one within the client's
        budget (InvalidField, or OverBudget: 429)."""
        check_constraint(msg, self._compiles, lambda field: self._spend(ident, field))

    def _tokenize(self, ident: bytes, msg: Generate) -> list[int]:
        """On the tokenizing thread: the constraint's verdict (kept since its compile; a
        new one only within the client's budget), then the prompt's ids, checked against the
        model (ids given are checked already, on the loop)."""
        check_constraint(msg, self._compiles, lambda field: self._spend(ident, field))
        if not isinstance(msg.prompt, str):
            return msg.prompt
        ids = self._tokenizer.encode(msg.prompt, msg.add_special_tokens)
        check_prompt_ids(ids, self._info, msg.max_tokens if msg.max_tokens_must_fit else None)
        return ids

    def _spend(self, ident: bytes, field: str) -> None:
        """One new constraint from `ident`: refused (429) past its budget."""
        if not self._budget.take(ident):
            raise self._budget.refusal(field)
