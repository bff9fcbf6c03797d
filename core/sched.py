"""Continuous batching with priority, aging and preemption by recompute
(docs/design/scheduler.md#scheduler-contract).

Every step `schedule` re-forms the batch in three phases (decodes, prefills in progress,
admissions; docs/design/scheduler.md#the-three-phases-of-schedule); `on_step` then takes the sampled
tokens. Pure Python, no I/O: the caller runs the model between the two calls.
"""
from __future__ import annotations

from array import array
from enum import Enum
from bisect import insort
from operator import attrgetter
from typing import Sequence

from core.blocks import Allocation, BlockSpace, FreeListBlocks, NoCapacity, PrefixHooks
from core.heap import LazyHeap
from core.prefill import Chunked, PrefillPolicy, WholePrompt
from core.prefix_cache import PrefixCacheBlocks
from core.speculate import Drafting
from core.sched_types import (AdmitError, Chunk, EmptyPrompt, FinishReason, Finished,
                               InvalidRequest, MAX_CACHE_SALT_CHARS, MAX_PRIORITY, NeverFits,
                               QueueFull, Request, RequestId, SchedPolicy, SchedStats,
                               SchedulerConfig, ScheduleOutput, StepOutput, TokenEvent, TooLong)

__all__ = [
    "RequestId", "BlockSpace", "FreeListBlocks", "NoCapacity", "Allocation", "PrefixHooks",
    "PrefixCacheBlocks",
    "PrefillPolicy", "WholePrompt", "Chunked", "SchedPolicy", "SchedulerConfig", "Request",
    "AdmitError", "QueueFull", "EmptyPrompt", "TooLong", "NeverFits", "InvalidRequest",
    "Chunk", "ScheduleOutput", "StepOutput", "FinishReason", "TokenEvent", "Finished",
    "SchedStats", "Scheduler", "MAX_PRIORITY",
]


class ReqStatus(Enum):
    """Where a request is: in the waiting heap (new or preempted by recompute), running
    (holding blocks, in the running list), or gone (finished or aborted)."""
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class _Req:
    __slots__ = ("id", "tokens", "num_tokens", "num_computed", "prompt_len", "max_tokens",
                 "key", "arrival", "limit", "rank", "handle", "status", "sample_step",
                 "placeholder_step", "cache_hits", "salt", "num_draft", "drafts", "num_taken",
                 "num_draft_cached", "embed", "pool_step")

    def __init__(self, id: int, tokens: list[int], max_tokens: int, max_model_len: int,
                 key: int, arrival: int):
        self.id = id
        self.tokens = tokens            # prompt + every generated token; survives preemption
        self.num_tokens = len(tokens)   # len(tokens), kept as an int for the hot loops
        self.num_computed = 0           # positions whose K/V are computed
        self.prompt_len = self.num_tokens
        self.max_tokens = max_tokens
        # num_tokens at which it ends (LENGTH)
        self.limit = min(self.num_tokens + max_tokens, max_model_len)
        self.key = key
        self.arrival = arrival
        self.rank = (-key, arrival, id)  # ascending rank tuple = descending rank
        self.handle = None              # the waiting heap's handle while waiting
        self.status = ReqStatus.WAITING
        self.sample_step: int | None = None       # the step whose output may carry its token
        self.placeholder_step: int | None = None  # the step whose token is tokens[-1], a
        #                                           placeholder until settled
        self.cache_hits = True          # admission may skip positions the prefix cache holds
        self.salt: str | None = None    # its prefix cache blocks are shared only within a salt
        self.num_draft = 0              # drafts it may get in a step (0: never speculated for)
        self.drafts: list[int] = []     # the last schedule's drafts for it
        self.num_taken = 0              # tokens it took in the last on_step (drafts: 1..k+1)
        self.num_draft_cached = 0       # positions the draft model holds KV for (draft_model)
        self.embed = False              # prefill only: pooled, never sampled
        self.pool_step: int | None = None   # the step pooling its last prompt position


_RANK = attrgetter("rank")
_NOTHING: tuple = ()


def _is_int(v: object) -> bool:
    return type(v) is int  # rejects bool and other int subclasses


def _validated_prompt(req: object) -> list[int]:
    if not isinstance(req, Request):
        raise InvalidRequest(f"expected a Request, got {type(req).__name__}")
    p = req.prompt
    if not isinstance(p, (list, tuple, array)):
        raise InvalidRequest(f"prompt must be a list of token ids, got {type(p).__name__}",
                             "prompt")
    tokens = list(p)
    if not all(type(t) is int and t >= 0 for t in tokens):
        raise InvalidRequest("prompt must hold non-negative int token ids only", "prompt")
    if not _is_int(req.max_tokens) or req.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be an int >= 1, got {req.max_tokens!r}",
                             "max_tokens")
    if not _is_int(req.priority) or not -MAX_PRIORITY <= req.priority <= MAX_PRIORITY:
        raise InvalidRequest(f"priority must be an int in [-{MAX_PRIORITY}, {MAX_PRIORITY}], "
                             f"got {req.priority!r}", "priority")
    salt = req.cache_salt
    if salt is not None and (type(salt) is not str or len(salt) > MAX_CACHE_SALT_CHARS):
        raise InvalidRequest(f"cache_salt must be a string of at most {MAX_CACHE_SALT_CHARS} "
                             "characters", "cache_salt")
    return tokens


class Scheduler:
    """Decides every step which requests run. Rank: (key desc, arrival asc, id asc) with
    key = priority * aging_steps - arrival (PRIORITY), priority (aging_steps None), 0 (FCFS).

    Invariants: `_running` is sorted by rank, highest first; a request is in exactly one of
    `_running` and `_waiting` while in `_reqs`; only running requests hold blocks.
    """

    def __init__(self, cfg: SchedulerConfig, blocks: BlockSpace,
                 prefill_policy: PrefillPolicy | None = None):
        if not isinstance(cfg, SchedulerConfig):
            raise TypeError(f"cfg must be a SchedulerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.blocks = blocks
        self._prefix: PrefixHooks | None = blocks if isinstance(blocks, PrefixHooks) else None
        self.prefill_policy = prefill_policy if prefill_policy is not None else WholePrompt()
        self._reqs: dict[RequestId, _Req] = {}
        self._waiting: LazyHeap[_Req] = LazyHeap()
        self._running: list[_Req] = []
        self._steps = 0
        self._next_id = 0
        self._preemptions = 0
        self._finished = 0
        self._last_chunks: Sequence[tuple[_Req, Chunk]] = _NOTHING
        # [[id, cached tokens], ...]: the last schedule's admissions that hit the prefix cache
        self.last_hits: list[list[int]] = []
        self._margin = self._margin_in_keys(cfg)
        # speculative decoding (docs/design/scheduler.md, "Speculative decoding")
        self._drafting = (Drafting(cfg.num_draft, cfg.spec_max_batch, cfg.draft_model)
                          if cfg.num_draft else None)
        self._spec: list[_Req] = []     # the last schedule's requests with drafts
        self.draft_tokens = 0           # drafts verified so far
        self.accepted_tokens = 0        # of them, those the target sampled too

    @staticmethod
    def _margin_in_keys(cfg: SchedulerConfig) -> int | None:
        if cfg.preempt_margin is None or cfg.policy is SchedPolicy.FCFS:
            return None
        if cfg.aging_steps is None:
            return cfg.preempt_margin
        return cfg.preempt_margin * cfg.aging_steps

    def _key(self, priority: int, arrival: int) -> int:
        cfg = self.cfg
        if cfg.policy is SchedPolicy.FCFS:
            return 0
        if cfg.aging_steps is None:
            return priority
        return priority * cfg.aging_steps - arrival

    # ------------------------------------------------------------------ inputs

    def add(self, req: Request) -> RequestId:
        """Queue a request; raises an AdmitError (and changes nothing) when refused."""
        tokens = _validated_prompt(req)
        cfg = self.cfg
        n = len(tokens)
        if n == 0:
            raise EmptyPrompt()
        if n >= cfg.max_model_len:
            raise TooLong(n, cfg.max_model_len)
        need = -(-min(n + req.max_tokens, cfg.max_model_len) // self.blocks.block_tokens())
        total = self.blocks.total_blocks()
        if need > total:
            raise NeverFits(need, total)
        if len(self._waiting) >= cfg.max_waiting:
            raise QueueFull(cfg.max_waiting)
        seq_id = self._next_id
        self._next_id += 1
        r = _Req(seq_id, tokens, req.max_tokens, cfg.max_model_len,
                 self._key(req.priority, self._steps), self._steps)
        r.cache_hits = bool(req.cache_hits)
        r.salt = req.cache_salt
        r.num_draft = cfg.num_draft if req.speculative is True else 0
        r.embed = req.embed is True
        self._reqs[seq_id] = r
        r.handle = self._waiting.push(r.rank, r)
        return seq_id

    def abort(self, id: RequestId) -> None:
        """Drop a running or waiting request and free its blocks. Emits no event; unknown
        or already finished ids are ignored."""
        try:
            r = self._reqs.pop(id, None)
        except TypeError:  # unhashable id: cannot be ours
            return
        if r is None:
            return
        if r.status is ReqStatus.RUNNING:
            self._running.remove(r)
            self._release(r)
        else:
            self._waiting.remove(r.handle)
            r.handle = None
        r.sample_step = None
        r.status = ReqStatus.FINISHED
        self._finished += 1

    def preempt_all(self) -> list[RequestId]:
        """Preempt every running request (a replaced worker lost the KV cache). Returns the
        ids in the order preempted: lowest rank first."""
        ids = []
        running = self._running
        while running:
            r = running.pop()
            self._to_waiting(r)
            ids.append(r.id)
        self._last_chunks = _NOTHING
        if self._prefix is not None:
            self._prefix.drop_cached()  # the cached K/V went with the worker
        return ids

    # ------------------------------------------------------------------ the step

    def schedule(self) -> ScheduleOutput:
        step = self._steps
        self._steps += 1
        if self.last_hits:
            self.last_hits = []
        preempted: list[RequestId] = []
        if self._margin is not None:
            self._preempt_for_head(preempted)
        drafts: dict[RequestId, list[int]] = {}
        decodes, prefilling, budget = self._decode_phase(step, preempted, drafts)
        chunks: list[tuple[_Req, Chunk]] = []
        if budget > 0:
            alone = not decodes
            budget = self._prefill_phase(prefilling, chunks, step, budget, alone)
            if budget > 0:
                self._admit_phase(chunks, step, budget, alone and not chunks)
        self._last_chunks = chunks
        pooled = [r.id for r, _ in chunks if r.pool_step == step]
        return ScheduleOutput([ch for _, ch in chunks], decodes, preempted, drafts, pooled)

    def _preempt_for_head(self, preempted: list[RequestId]) -> None:
        """Phase 0: a waiting head that outranks the lowest running request by the margin
        and cannot be admitted takes its place."""
        running, waiting = self._running, self._waiting
        B = self.blocks.block_tokens()
        while running and waiting:
            head = waiting.peek()
            seat = len(running) < self.cfg.max_seqs
            if seat and -(-head.num_tokens // B) <= self.blocks.free_blocks():
                return
            if head.key - running[-1].key < self._margin:
                return
            victim = running.pop()
            self._to_waiting(victim)
            preempted.append(victim.id)

    def _decode_phase(self, step: int, preempted: list[RequestId],
                      drafts: dict[RequestId, list[int]]):
        """Phase 1: decodes in rank order, each with its drafts when the step speculates.
        Also collects the prefills in progress (phase 2) in rank order; that list is
        complete whenever budget is left."""
        budget = self.cfg.max_batch_tokens
        spec = self._drafting is not None and self._drafting.step_speculates(
            len(self._running))
        decodes: list[RequestId] = []
        prefilling: list[_Req] = []
        append_slot = self.blocks.append_slot
        schedule_decode = decodes.append
        # preemption pops only from the end of _running, behind the iterator
        for r in self._running:
            d = r.num_tokens - r.num_computed
            if d == 1 and not r.embed:
                if r.num_tokens >= r.limit:
                    continue  # held: its last token is in flight (on_step_ahead)
                if budget == 0:
                    break
                try:
                    append_slot(r.id, r.num_tokens)
                except NoCapacity:
                    if not self._make_room(r, preempted):
                        break  # r was the last running request and preempted itself
                r.sample_step = step
                schedule_decode(r.id)
                budget -= 1
                if spec and r.num_draft and budget:
                    budget -= self._draft(r, budget, drafts)
            elif d > 0:   # a prefill (an embedding's last token too); 0: a pooling in flight
                prefilling.append(r)
        return decodes, prefilling, budget

    def _draft(self, r: _Req, budget: int, drafts: dict[RequestId, list[int]]) -> int:
        """Give decode r its drafts: k more query tokens at positions n..n+k-1, their KV
        slots allocated. Drafts never preempt: they take blocks only while every running
        request keeps one free block for its own decode. Returns k (0: none)."""
        if r.placeholder_step is not None:
            return 0   # its last token is a placeholder (overlapped): nothing to match
        d = self._drafting.drafts(r.tokens, r.num_draft, min(budget, r.limit - r.num_tokens - 1))
        if not d:
            return 0
        blocks = self.blocks
        need = -(-(r.num_tokens + len(d)) // blocks.block_tokens()) - len(blocks.block_table(r.id))
        if need > 0:
            if blocks.free_blocks() - need < len(self._running):
                return 0
            try:
                blocks.append_slot(r.id, r.num_tokens + len(d))
            except NoCapacity:
                return 0
        r.drafts, r.num_taken = d, 0
        drafts[r.id] = d
        self._spec.append(r)
        return len(d)

    def _make_room(self, r: _Req, preempted: list[RequestId]) -> bool:
        running = self._running
        while True:
            # everything after r is unscheduled, so the last running request is the
            # lowest-ranked one not yet scheduled (possibly r itself)
            victim = running.pop()
            self._to_waiting(victim)
            preempted.append(victim.id)
            if victim is r:
                return False
            try:
                self.blocks.append_slot(r.id, r.num_tokens)
                return True
            except NoCapacity:
                pass

    def _prefill_phase(self, prefilling: list[_Req], chunks: list, step: int, budget: int,
                       alone: bool) -> int:
        """Phase 2: the next chunk of each prefill in progress, in rank order."""
        chunk_len = self.prefill_policy.chunk_len
        for r in prefilling:
            if budget <= 0:
                break
            length = min(chunk_len(r.num_tokens - r.num_computed, budget, alone), r.num_tokens - r.num_computed)
            if length > 0:
                self._add_chunk(r, r.num_computed, length, chunks, step)
                budget -= length
                alone = False
        return budget

    def _admit_phase(self, chunks: list, step: int, budget: int, alone: bool) -> None:
        """Phase 3: admit from the waiting head while seats, budget and blocks last; the
        first request that does not fit stops admission (no skipping ahead)."""
        running, waiting = self._running, self._waiting
        chunk_len = self.prefill_policy.chunk_len
        max_seqs = self.cfg.max_seqs
        while budget > 0 and len(running) < max_seqs and waiting:
            r = waiting.peek()
            length = chunk_len(r.num_tokens - self._cached_prefix(r), budget, alone)
            if length <= 0:
                return
            try:
                alloc = self._allocate(r)
            except NoCapacity:
                return
            waiting.pop()
            r.handle = None
            r.status = ReqStatus.RUNNING
            insort(running, r, key=_RANK)
            r.num_computed = min(alloc.cached_tokens, r.num_tokens - 1)  # a prefix hit skips computed positions
            if r.num_computed:
                self.last_hits.append([r.id, r.num_computed])
            length = min(length, r.num_tokens - r.num_computed)
            self._add_chunk(r, r.num_computed, length, chunks, step)
            budget -= length
            alone = False

    def _cached_prefix(self, r: _Req) -> int:
        """Positions a prefix hit would skip now: the policy sizes only computed tokens."""
        if self._prefix is None or not r.cache_hits:
            return 0
        return self._prefix.cached_prefix(r.tokens, r.salt)

    def _allocate(self, r: _Req) -> Allocation:
        if self._prefix is None:
            return self.blocks.allocate(r.id, r.tokens)
        return self._prefix.allocate(r.id, r.tokens, priority=self._evict_priority(r),
                                     lookup=r.cache_hits, salt=r.salt)

    def _evict_priority(self, r: _Req) -> int:
        """The priority level, not the aged key: with aging the key falls with arrival,
        which would evict the newest requests' blocks first."""
        cfg = self.cfg
        if cfg.policy is SchedPolicy.FCFS:
            return 0
        if cfg.aging_steps is None:
            return r.key
        return (r.key + r.arrival) // cfg.aging_steps

    @staticmethod
    def _add_chunk(r: _Req, start: int, length: int, chunks: list, step: int) -> None:
        last = start + length == r.num_tokens
        if last and r.embed:   # pooled, not sampled: it advances as a middle chunk does
            r.pool_step, last = step, False
        elif last:
            r.sample_step = step
        chunks.append((r, Chunk(r.id, start, length, last)))

    def on_step(self, outputs: Sequence[StepOutput],
                pooled: Sequence[RequestId] = ()) -> list[TokenEvent | Finished]:
        """Advance the computed positions of the last schedule and take its sampled tokens;
        `pooled`: the embedding requests whose vector came back, which finish "stop".

        Outputs for requests that did not sample in that step are ignored. A sampling row
        (decode or last chunk) left without an output is not advanced: it runs again; so
        does a pooled chunk without its vector.
        """
        pools = [(r, ch) for r, ch in self._last_chunks if r.pool_step == self._steps - 1]
        computed, B = self._advance_chunks()
        step = self._steps - 1
        get = self._reqs.get
        events: list[TokenEvent | Finished] = []
        emit = events.append
        finished = self._pooled(pools, pooled, events)
        for o in outputs:
            r = get(o.id)
            if r is None:
                continue
            if r.sample_step == step:
                r.sample_step = None
            elif not 0 < r.num_taken <= len(r.drafts):  # else a verified draft's next token
                continue
            r.num_taken += 1
            n = r.num_tokens
            if computed is not None and n // B > r.num_computed // B:
                computed(r.id, r.tokens, n)
            r.num_computed = n  # a sampling row computes every position up to the newest token
            token = o.token
            r.tokens.append(token)
            r.num_tokens = n = n + 1
            emit(TokenEvent(r.id, token))
            if o.stop:
                self._finish(r, FinishReason.STOP, events)
                finished = True
            elif n >= r.limit:
                self._finish(r, FinishReason.LENGTH, events)
                finished = True
        if finished:  # one pass, not a list.remove per finished request
            self._running = [r for r in self._running if r.status is ReqStatus.RUNNING]
        if self._spec:
            self._settle_drafts()
        return events

    def _pooled(self, pools: list, pooled: Sequence[RequestId], events: list) -> bool:
        """The last schedule's pooled chunks (advanced): those whose vector came back
        finish "stop", the others run their chunk again. True when any finished."""
        if not pools:
            return False
        back, finished = set(pooled), False
        for r, ch in pools:
            r.pool_step = None
            if r.status is not ReqStatus.RUNNING:   # aborted since it was scheduled
                continue
            if r.id in back:
                self._finish(r, FinishReason.STOP, events)
                finished = True
            else:
                r.num_computed = ch.start
        return finished

    def _settle_drafts(self) -> None:
        """After on_step: the last schedule's speculating requests give back the slots of
        their rejected drafts (whole blocks past their length) and adapt their k."""
        for r in self._spec:
            if r.num_taken:
                self.draft_tokens += len(r.drafts)
                self.accepted_tokens += r.num_taken - 1
            if r.status is ReqStatus.RUNNING:
                self.blocks.truncate(r.id, r.num_tokens)
                if r.num_taken:
                    r.num_draft = self._drafting.adapt(r.num_draft, len(r.drafts), r.num_taken - 1)
                    r.num_draft_cached = self._drafting.model_seen(r.num_tokens - r.num_taken, r.num_taken, len(r.drafts))
            r.drafts = []
        self._spec = []

    def _advance_chunks(self):
        """The last schedule's chunks that do not sample advance; (computed hook, B)."""
        computed = None if self._prefix is None else self._prefix.computed
        B = self.blocks.block_tokens()
        for r, ch in self._last_chunks:
            if not ch.last:
                r.num_computed += ch.length
                if computed is not None and r.num_computed // B > ch.start // B:
                    computed(r.id, r.tokens, r.num_computed)  # its full blocks become cached at once
        self._last_chunks = _NOTHING
        return computed, B

    # ---------------------------------------------- overlapped scheduling (docs/design/overlap.md)

    def on_step_ahead(self, ids: Sequence[RequestId]) -> None:
        """The last schedule is running and its tokens are not known yet: advance it as
        on_step would, with the placeholder -1 - j as the token of sample row j (ids[j]).
        Nothing finishes here; a request at its limit is held (not scheduled) until `settle`
        (docs/design/overlap.md, "Overlapped scheduling")."""
        computed, B = self._advance_chunks()
        step = self._steps - 1
        get = self._reqs.get
        for j, seq_id in enumerate(ids):
            r = get(seq_id)
            if r is None or r.sample_step != step:
                continue
            r.sample_step = None
            n = r.num_tokens
            if computed is not None and n // B > r.num_computed // B:
                computed(r.id, r.tokens, n)  # tokens[:n] are real: the last settle came first
            r.num_computed = n
            r.tokens.append(-1 - j)
            r.num_tokens = n + 1
            r.placeholder_step = step

    def settle(self, step: int, outputs: Sequence[StepOutput],
               pooled: Sequence[RequestId] = ()) -> list[TokenEvent | Finished]:
        """The tokens of `step`, advanced by on_step_ahead: each replaces its placeholder
        (still the request's last token) and may finish the request, running or preempted
        meanwhile. Outputs of requests aborted or finished since are ignored. `pooled`:
        the embedding requests pooled in `step` whose vector came back: they finish "stop"
        (one preempted meanwhile lost its pool_step and is recomputed)."""
        get = self._reqs.get
        events: list[TokenEvent | Finished] = []
        finished = False
        for seq_id in pooled:
            r = get(seq_id)
            if r is not None and r.pool_step == step and r.status is ReqStatus.RUNNING:
                r.pool_step = None
                self._finish(r, FinishReason.STOP, events)
                finished = True
        for o in outputs:
            r = get(o.id)
            if r is None or r.placeholder_step != step:
                continue
            r.placeholder_step = None
            r.tokens[-1] = o.token
            events.append(TokenEvent(r.id, o.token))
            reason = (FinishReason.STOP if o.stop else
                      FinishReason.LENGTH if r.num_tokens >= r.limit else None)
            if reason is None:
                continue
            if r.status is ReqStatus.RUNNING:
                self._finish(r, reason, events)
                finished = True
            else:   # preempted while its token was in flight: it holds no blocks
                self._waiting.remove(r.handle)
                r.handle = None
                del self._reqs[r.id]
                self._finished += 1
                events.append(Finished(r.id, reason))
        if finished:
            self._running = [r for r in self._running if r.status is ReqStatus.RUNNING]
        return events

    def rollback(self, step: int) -> None:
        """`step` was lost with its worker: its placeholders go, its poolings run again;
        a restart follows."""
        for r in self._reqs.values():
            if r.pool_step == step:
                r.pool_step = None
                r.num_computed = min(r.num_computed, r.num_tokens - 1)
            if r.placeholder_step == step:
                r.placeholder_step = None
                r.tokens.pop()
                r.num_tokens -= 1
                r.num_computed = min(r.num_computed, r.num_tokens - 1)

    # ------------------------------------------------------------------ moves

    def _finish(self, r: _Req, reason: FinishReason, events: list) -> None:
        """Leaves `_running` to the caller."""
        r.status = ReqStatus.FINISHED
        self._release(r)
        del self._reqs[r.id]
        self._finished += 1
        events.append(Finished(r.id, reason))

    def _to_waiting(self, r: _Req) -> None:
        """Preempt by recompute: free the blocks, keep every token, keep the arrival."""
        self._release(r)
        r.num_computed = 0
        r.num_draft_cached = 0   # its blocks, the draft model's KV in them included, are gone
        r.status = ReqStatus.WAITING
        r.sample_step = None
        r.pool_step = None       # a pooling in flight is recomputed
        r.handle = self._waiting.push(r.rank, r)
        self._preemptions += 1

    def _release(self, r: _Req) -> None:
        self.blocks.release(r.id, r.tokens[:r.num_computed])

    # ------------------------------------------------------------------ queries

    def tokens(self, id: RequestId) -> Sequence[int] | None:
        """Prompt + generated tokens (the live list: read it, don't change it); None once
        the request finished or was aborted."""
        r = self._reqs.get(id)
        return None if r is None else r.tokens

    def draft_seen(self, id: RequestId) -> int:
        """Positions of id the worker's draft model holds KV for (0 once it finished)."""
        r = self._reqs.get(id)
        return 0 if r is None else r.num_draft_cached

    def prompt_len(self, id: RequestId) -> int | None:
        r = self._reqs.get(id)
        return None if r is None else r.prompt_len

    def unfinished(self) -> list[RequestId]:
        """Running and waiting ids, ascending."""
        return list(self._reqs)

    def has_unfinished(self) -> bool:
        return bool(self._reqs)

    def stats(self) -> SchedStats:
        return SchedStats(
            running=len(self._running), waiting=len(self._waiting),
            free_blocks=self.blocks.free_blocks(), total_blocks=self.blocks.total_blocks(),
            steps=self._steps, preemptions=self._preemptions, finished=self._finished)

    def snapshot(self) -> tuple:
        """A deterministic description of the state, for the step log's state hash.

        Running requests in their (deterministic) running order, each with its live block
        table: serialize it at once, before the scheduler changes again."""
        table = self.blocks.block_table
        return (self._steps, self._next_id, self._preemptions, self._finished,
                self.blocks.free_blocks(), len(self._waiting),
                [(r.id, r.num_tokens, r.num_computed, table(r.id)) for r in self._running])
