"""The scheduler's pinned API types (docs/design/scheduler.md#the-scheduler-api): config, requests,
refusals, the plan of a step and its events. core.sched re-exports every name."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# The scheduler's id of a request. Code calls it `seq_id`; the pinned API below keeps the
# name `id` (Chunk.id, StepOutput.id, abort(id), ...), the step log's columns requests.id and
# inputs.request_id hold it, and so does Result.metrics["log_id"] (core/request_metrics.py).
RequestId = int
# Its bounds are core/bounds.py's, re-exported here as the pinned API has them. Keep this
# module import-light.
from core.bounds import MAX_CACHE_SALT_CHARS, MAX_NUM_DRAFT, MAX_PRIORITY  # noqa: F401,E402


class SchedPolicy(Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


def _positive(name: str, value: object) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass
class SchedulerConfig:
    """max_seqs, max_batch_tokens and max_waiting are read at every use and may be tuned
    between steps; the other fields must not change once a Scheduler holds the config."""

    max_seqs: int = 256
    max_batch_tokens: int = 2048
    max_waiting: int = 10000
    policy: SchedPolicy = SchedPolicy.PRIORITY
    aging_steps: int | None = 32     # None: strict priority
    max_model_len: int = 2048
    preempt_margin: int | None = None  # in priority levels; None: never preempt for arrivals
    # speculative decoding (core/speculate.py): at most num_draft drafts per request and
    # step (0: off), only in steps with at most spec_max_batch requests running;
    # draft_model: the worker's draft model proposes them (worker/draft.py), not n-grams
    num_draft: int = 0
    spec_max_batch: int = 8
    draft_model: bool = False

    def __post_init__(self) -> None:
        for name in ("max_seqs", "max_batch_tokens", "max_waiting", "max_model_len"):
            _positive(name, getattr(self, name))
        _positive("spec_max_batch", self.spec_max_batch)
        if type(self.draft_model) is not bool:
            raise ValueError(f"draft_model must be a bool, got {self.draft_model!r}")
        if type(self.num_draft) is not int or not 0 <= self.num_draft <= MAX_NUM_DRAFT:
            raise ValueError(f"num_draft must be an int in [0, {MAX_NUM_DRAFT}], got {self.num_draft!r}")
        for name in ("aging_steps", "preempt_margin"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if isinstance(self.policy, str):
            try:
                self.policy = SchedPolicy(self.policy.lower())
            except ValueError:
                raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        elif not isinstance(self.policy, SchedPolicy):
            raise ValueError(f"policy must be a SchedPolicy, got {self.policy!r}")


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    priority: int = 0
    cache_hits: bool = True   # False: admission computes every position (prompt logprobs)
    cache_salt: str | None = None   # only requests of equal salt share cached blocks
    speculative: bool = True  # False: never drafted for (the engine decides, core/engine.py)
    # prefill only (an embedding): no token is sampled; the step that computes its last
    # prompt position pools it and the request finishes "stop" (docs/design/scheduler.md,
    # "Embedding requests")
    embed: bool = False


class AdmitError(Exception):
    """`add` refused the request; the scheduler is unchanged and no id was used."""
    param: str | None = None   # the request field at fault (an HTTP 400's param)


class QueueFull(AdmitError):
    def __init__(self, limit: int | None = None):
        super().__init__(limit)
        self.limit = limit

    def __str__(self) -> str:
        return f"waiting queue is full ({self.limit} requests)"


class EmptyPrompt(AdmitError):
    param = "prompt"

    def __str__(self) -> str:
        return "the prompt is empty"


class TooLong(AdmitError):
    param = "prompt"

    def __init__(self, tokens: int, limit: int):
        super().__init__(tokens, limit)
        self.tokens = tokens
        self.limit = limit

    def __str__(self) -> str:
        return (f"the prompt has {self.tokens} tokens; it must be shorter than the "
                f"context limit of {self.limit}")


class NeverFits(AdmitError):
    param = "max_tokens"   # the caller knows better when the prompt alone never fits

    def __init__(self, blocks: int, total: int):
        super().__init__(blocks, total)
        self.blocks = blocks
        self.total = total

    def __str__(self) -> str:
        return (f"the request may need {self.blocks} KV blocks; the pool has only "
                f"{self.total}")


class InvalidRequest(AdmitError, ValueError):
    """Wrong types or out-of-range arguments."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class Chunk:
    id: RequestId
    start: int
    length: int
    last: bool  # the chunk reaches the newest token: its last row is sampled


@dataclass(slots=True)
class ScheduleOutput:
    prefill: list[Chunk] = field(default_factory=list)
    decode: list[RequestId] = field(default_factory=list)
    preempted: list[RequestId] = field(default_factory=list)
    # decodes verified with drafts (speculative decoding): id -> its drafts, in decode order
    drafts: dict[RequestId, list[int]] = field(default_factory=dict)
    # embedding requests whose chunk reaches their last prompt position, in prefill order:
    # that chunk has last=False (nothing is sampled) and its last query token is pooled
    pooled: list[RequestId] = field(default_factory=list)


@dataclass(slots=True)
class StepOutput:
    id: RequestId
    token: int
    stop: bool = False


class FinishReason(Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


# Their values, as the wire, the step log and the gateway's metrics carry them.
FINISH_REASONS = tuple(r.value for r in FinishReason)


@dataclass(slots=True)
class TokenEvent:
    id: RequestId
    token: int


@dataclass(slots=True)
class Finished:
    id: RequestId
    reason: FinishReason


@dataclass(frozen=True)
class SchedStats:
    running: int
    waiting: int
    free_blocks: int
    total_blocks: int
    steps: int          # schedule() calls so far
    preemptions: int    # preemptions so far, preempt_all included
    finished: int       # requests that left: completed (stop or length) plus aborted
