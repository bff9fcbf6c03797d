"""Every message on every socket, as typed dataclasses (the codec is core/ipc/wire.py).

Sockets: client <-> frontend (ROUTER), frontend <-> core and core <-> worker (PUSH/PULL
pairs bound by the core). `encode`/`decode` and the packed arrays are re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from core.ipc.wire import (DEFAULT_MAX_FRAME_BYTES, F64, I32, I64, ProtocolError, decode,  # noqa: F401
                       encode, message)

# ---------------------------------------------------------------- shared payloads

@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class ModelInfo:
    """What the worker tells the core (and the core the frontend) at start-up."""
    model: str
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    eos_ids: list[int]
    dtype: str = "float32"
    device: str = "cpu"
    tokenizer: str = ""           # a local HF directory holding the tokenizer


# ---------------------------------------------------------------- client <-> frontend

@message("generate")
class Generate:
    request_id: str
    prompt: Union[str, list[int]]
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | None = None
    priority: int = 0
    ignore_eos: bool = False


@message("abort")
class Abort:
    request_id: str


@message("stats")
class Stats:
    pass


@message("ping")
class Ping:
    pass


@message("delta")
class Delta:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None


@message("error")
class ErrorReply:
    request_id: str | None
    code: int
    message: str


@message("stats_reply")
class StatsReply:
    stats: dict


@message("pong")
class Pong:
    pass


# ---------------------------------------------------------------- frontend <-> core

@message("add")
class AddRequest:
    fid: int                      # the frontend's key for the request
    request_id: str               # the client's
    prompt: I32
    max_tokens: int
    priority: int
    sampling: SamplingParams
    ignore_eos: bool = False


@message("abort_req")
class AbortRequest:
    fid: int


@message("stats_query")
class StatsQuery:
    qid: int


@message("hello")
class Hello:
    """A frontend (re)started: the core aborts every request of earlier frontends and
    answers CoreReady once its engine runs."""
    pid: int


@message("drain")
class Drain:
    """The frontend stops accepting; the core finishes what runs."""
    pass


@message("rejected")
class Rejected:
    fid: int
    code: int
    message: str


@message("events")
class StepEvents:
    """One step's output for the frontend: token i of the step belongs to fids[i]."""
    fids: I32
    tokens: I32
    finished: list[list[Any]]     # [[fid, reason], ...], reason "stop" | "length" | "abort"


@message("core_stats")
class CoreStats:
    qid: int
    stats: dict


@message("core_ready")
class CoreReady:
    info: ModelInfo
    pid: int
    worker_pid: int


# ---------------------------------------------------------------- core <-> worker

@message("forward")
class ForwardBatch:
    """One step's work for the worker. Sequences are decodes first, then prefill chunks.

    Sequence i owns query tokens input_ids[query_start[i]:query_start[i+1]], at
    `positions`, whose K/V go to `slot_mapping` (block_id * block_size + offset). After the
    step sequence i has context_lens[i] tokens in cache, in blocks
    block_tables[i*table_width:(i+1)*table_width] (padded with 0 past its blocks).
    sample_rows lists the sequences whose last query token is sampled, in output order;
    row j samples with temperature[j], top_p[j], top_k[j], seeds[j] and is the
    gen_index[j]-th generated token of its request.
    """
    step: int
    seq_ids: I32
    input_ids: I32
    positions: I32
    slot_mapping: I32
    query_start: I32
    context_lens: I32
    block_tables: I32
    table_width: int
    sample_rows: I32
    temperature: F64
    top_p: F64
    top_k: I32
    seeds: I64
    gen_index: I32

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@message("step_result")
class StepResult:
    step: int
    tokens: I32                   # one per sample row, in sample_rows order


@message("worker_ready")
class WorkerReady:
    info: ModelInfo
    pid: int


@message("shutdown")
class Shutdown:
    pass
