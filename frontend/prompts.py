"""The frontend's half that prepares a Generate off its loop: its constraint compiled
(bounded, remembered by key: compile_check.py; a new one within its client's budget:
constraint_budget.py) and its text prompt turned into ids. What the tokenizing thread runs,
and what the loop does with its results (frontend/tokenizing.py).

Mixed into Frontend (process.py), whose state it shares: `tokenizer`, `info`, `compiles`,
`budget`, `tokenizing`, `router`, `core_dead`, `_admit` and `_error`.
"""
from __future__ import annotations

import logging

from core.ipc.protocol import Delta, Deltas, Generate
from frontend.core_side import CORE_DIED
from frontend.structured import check_constraint
from frontend.tokenizing import Job
from frontend.validate import InvalidField, check_prompt_ids

log = logging.getLogger("frontend")


class PromptSide:
    def _tokenize(self, ident: bytes, msg: Generate) -> list[int]:
        """On the tokenizing thread: the constraint compiled (a new one only within the
        client's budget), then the prompt's ids, checked against the model (ids given are
        checked already, on the loop)."""
        check_constraint(msg, self.compiles, lambda field: self._spend(ident, field))
        if not isinstance(msg.prompt, str):
            return msg.prompt
        ids = self.tokenizer.encode(msg.prompt, msg.add_special_tokens)
        check_prompt_ids(ids, self.info, msg.max_tokens if msg.max_tokens_must_fit else None)
        return ids

    def _spend(self, ident: bytes, field: str) -> None:
        """One new constraint from `ident`: refused (429) past its budget."""
        if not self.budget.take(ident):
            raise self.budget.refusal(field)

    def _on_tokenized(self) -> None:
        """On the loop: answer or admit every prompt the thread has finished."""
        for job in self.tokenizing.done():
            rid = job.msg.request_id
            if isinstance(job.error, InvalidField):
                self._error(job.ident, rid, job.error.code, str(job.error), job.error.field)
            elif job.error is not None:
                log.error("tokenizing request %r failed: %r", rid, job.error)
                self._error(job.ident, rid, 500, "the tokenizer failed on this prompt")
            elif self.core_dead:
                self._error(job.ident, rid, 503, CORE_DIED)
            else:   # accepted before a drain began: in flight, as the drain lets finish
                self._admit(job.ident, job.msg, job.ids, job.salt)

    def _abort_pending(self, jobs: list[Job | None]) -> None:
        """Each cancelled job's final reply, as an aborted request's (no tokens yet)."""
        for job in filter(None, jobs):
            self.router.send(job.ident, Deltas.of([Delta(job.msg.request_id, "", [], "abort")]))
