"""Prompts: the frontend's preparation of a Generate: the model's tokenizer, the checks
against the model, and the queue that tokenizes off the loop (frontend/tokenizing.py).

A text prompt is checked for size on the loop, then turned into ids on the tokenizing
thread; a constraint is compiled there too (bounded, remembered by key: compile_check.py; a
new one within its client's budget: constraint_budget.py). Ids given are checked on the
loop. The Frontend (frontend/process.py) asks `prepare`, admits what `done` yields, and
builds each request's state here (its decoders and stop ids come from the tokenizer).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from core.ipc.protocol import Delta, Generate, ModelInfo
from frontend.compile_check import CompileCheck
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
        self._compiles = CompileCheck(max_compile_ms)   # the tokenizing thread's only
        self._budget = ConstraintBudget(new_constraints_per_s)   # the thread's only too
        self._queue = TokenizeQueue(self._tokenize, notify)

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
        constrained = constraint_of(msg.response_format, msg.structured_outputs) is not None
        fit = msg.max_tokens if msg.max_tokens_must_fit else None
        if isinstance(msg.prompt, str):   # tokenized off the loop, then out of `done`
            check_prompt_text(self._tokenizer.bound, msg.prompt, self._info.max_model_len, fit)
        else:
            check_prompt_ids(msg.prompt, self._info, fit)
            if not constrained:
                return msg.prompt
        self._queue.submit(ident, msg, salt)
        return None

    def done(self) -> Iterator[Job]:
        """Every prompt the thread has finished: a failed one answered here, the rest
        yielded to be admitted (or refused, if the cores died meanwhile)."""
        for job in self._queue.done():
            rid = job.msg.request_id
            if isinstance(job.error, InvalidField):
                self._replies.error(job.ident, rid, job.error.code, str(job.error),
                                    job.error.field)
            elif job.error is not None:
                log.error("tokenizing request %r failed: %r", rid, job.error)
                self._replies.error(job.ident, rid, 500, "the tokenizer failed on this prompt")
            else:
                yield job

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
        return len(self._queue)

    def has(self, ident: bytes, request_id: str) -> bool:
        return self._queue.has(ident, request_id)

    def count_of(self, ident: bytes) -> int:
        return self._queue.count_of(ident)

    def abort(self, ident: bytes, request_id: str) -> None:
        """The client's Abort of a prompt still queued: its final abort reply."""
        self._abort_pending([self._queue.cancel(ident, request_id)])

    def abort_all(self) -> None:
        self._abort_pending(self._queue.drop_all())

    def drop(self, ident: bytes) -> None:
        """A gone client's queued prompts, without a reply."""
        self._queue.drop(ident)

    def close(self) -> None:
        self._queue.close()

    def _abort_pending(self, jobs: list[Job | None]) -> None:
        """Each cancelled job's final reply, as an aborted request's (no tokens yet)."""
        for job in filter(None, jobs):
            self._replies.aborted(job.ident, Delta(job.msg.request_id, "", [], "abort"))

    # ------------------------------------------------------------ on the thread

    def _tokenize(self, ident: bytes, msg: Generate) -> list[int]:
        """On the tokenizing thread: the constraint compiled (a new one only within the
        client's budget), then the prompt's ids, checked against the model (ids given are
        checked already, on the loop)."""
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
