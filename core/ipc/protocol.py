"""Every message on every socket, as typed dataclasses (the codec is core/ipc/wire.py).

Sockets: client <-> frontend (ROUTER), frontend <-> core and core <-> worker (PUSH/PULL
pairs bound by the core), and a joined replica's core <-> the frontend's --replica-address
(DEALER -> ROUTER, docs/design/processes.md "Joined replicas"); and one pipe, the frontend
<-> its compile process (length-prefixed frames: frontend/compile_process.py). `encode`/`decode`
and the packed arrays are re-exported here.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Union

from core.ipc.wire import (DEFAULT_MAX_FRAME_BYTES, F32, F64, I32, I64, ProtocolError, decode,  # noqa: F401
                       encode, message)

# Where clients find the frontend unless told otherwise (scripts/serve --address, Client).
DEFAULT_ADDRESS = "tcp://127.0.0.1:7600"

# ---------------------------------------------------------------- shared payloads

CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match (docs/structured.md): kind "json" (text: a JSON
    schema), "regex", "choice" (text: a JSON list of strings) or "grammar" (Lark or GBNF)."""
    kind: str
    text: str

    @cached_property
    def key(self) -> str:
        """The worker's cache key for its compiled grammar."""
        h = hashlib.blake2b(f"{self.kind}\0{self.text}".encode(), digest_size=16)
        return h.hexdigest()


@dataclass
class SamplingParams:
    """How a request's tokens are drawn; logged with the request (replay rebuilds them).
    Penalties and min_tokens are functions of the request's tokens so far and these
    fields, so sampling stays stateless (docs/design/worker.md, "Stateless seeded sampling")."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0                    # EOS and stop_token_ids are banned before this
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None            # None: none; k: the chosen token's and top k
    prompt_logprobs: int | None = None     # None: none; k: each prompt token's and top k
    constraint: Constraint | None = None   # structured outputs (docs/structured.md)
    speculative: bool = True               # False: never verified with drafts

    def __post_init__(self):   # the step log holds it as a JSON object (replay)
        if isinstance(self.constraint, dict):
            self.constraint = Constraint(**self.constraint)

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


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
    tp: int = 1                   # tensor-parallel ranks the worker runs as
    batch_invariant: bool = False  # --batch-invariant: a row's logits ignore the batch
    checkpoint: dict = field(default_factory=dict)   # where the weights came from: format,
    # and for a GGUF file its path, sha256, architecture and tensor types (worker/load.py)
    weights: str = ""             # sha256 of the weights as loaded (worker/digest.py); "" for none
    quantization: dict = field(default_factory=dict)   # {"mode": gguf | q8_0 | q4_0 | none,
    # "layers": {module name: type}} (worker/quantized.py)
    draft: str = ""               # the draft model that proposes drafts (worker/draft.py); "" none
    threads: dict = field(default_factory=dict)   # {"count": torch's pool width, "wait": the
    # OpenMP wait policy it runs under} (worker/threads.py)
    hidden_size: int = 0          # an embedding's length (worker/pooling.py); 0: unknown


# ---------------------------------------------------------------- client <-> frontend

# The client <-> frontend wire's version. 1: a Delta frame per request per step (before
# Generate had `wire`); 2: a Deltas frame per client per step. A Generate of another
# version is a 400 naming `wire`, so a client of the old wire hears why rather than
# dropping frames it cannot read until its timeout.
WIRE = 2


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
    logprobs: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    add_special_tokens: bool = True        # a text prompt is tokenized as tokenizer(text)
    user: str | None = None
    # True: prompt + max_tokens over max_model_len is a 400 (naming max_tokens); False:
    # the request ends "length" at the context
    max_tokens_must_fit: bool = False
    prompt_logprobs: int | None = None     # each prompt token's logprob and the top k
    # structured outputs (docs/structured.md): OpenAI's and vLLM's objects, at most one
    response_format: dict | None = None
    structured_outputs: dict | None = None
    # the gateway's: the short hash of the API key that sent it (frontend/http/identity.py)
    key_hash: str | None = None
    # only requests of equal salt share prefix cache blocks (docs/security.md)
    cache_salt: str | None = None
    # False: never verified with drafts (docs/design/scheduler.md, "Speculative decoding")
    speculative: bool = True
    wire: int = 1                 # the client's wire version (WIRE); absent: 1
    # the gateway's HMAC over request_id and key_hash (frontend/caller.py): a key_hash
    # without it is refused, so no client names another's key
    key_proof: str | None = None
    # an embedding, not a generation (docs/design/worker.md, "Embeddings"): the prompt is
    # computed, its last position pooled; the final delta carries the vector, no tokens
    embed: bool = False


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
    logprobs: list[float] | None = None    # one per token_ids entry, when asked
    top_logprobs: list[Any] | None = None  # per token: [[token id, logprob], ...]
    metrics: dict | None = None            # on the last delta (docs/design/worker.md#request-metrics)
    # first delta, when asked: None for position 0, then per prompt position p
    # [logprob, rank, [[token id, logprob], ...]] (docs/design/worker.md, "Prompt logprobs")
    prompt_logprobs: list[Any] | None = None
    embedding: F32 | None = None           # an embed request's vector, on its final delta


@message("deltas")
class Deltas:
    """Wire 2: one client's deltas of one step, each request at most once. A delta of
    text and tokens alone travels in the columns (counts[i] tokens of `tokens` are
    request_ids[i]'s); any other (a first or last delta, logprobs) in `full` as it is."""
    request_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    counts: I32 = field(default_factory=I32)
    tokens: I32 = field(default_factory=I32)
    full: list[Delta] = field(default_factory=list)

    @classmethod
    def of(cls, deltas: list[Delta]) -> "Deltas":
        frame = cls()
        for d in deltas:
            frame.add(d)
        return frame

    def add(self, d: Delta) -> None:
        if (d.finish_reason is None and d.prompt_token_ids is None and d.logprobs is None
                and d.metrics is None and d.prompt_logprobs is None and d.embedding is None):
            self.request_ids.append(d.request_id)
            self.texts.append(d.text)
            self.counts.append(len(d.token_ids))
            self.tokens.extend(d.token_ids)
        else:
            self.full.append(d)

    def __len__(self) -> int:
        return len(self.request_ids) + len(self.full)

    def unpack(self) -> list[Delta]:
        """The deltas, one per request; ProtocolError(400) if the columns disagree."""
        n = len(self.request_ids)
        if len(self.texts) != n or len(self.counts) != n or sum(self.counts) != len(self.tokens):
            raise ProtocolError(400, "deltas: columns of different lengths")
        if any(c < 0 for c in self.counts):
            raise ProtocolError(400, "deltas: a negative token count")
        out, toks, at = [], self.tokens.tolist(), 0
        for rid, text, c in zip(self.request_ids, self.texts, self.counts):
            out.append(Delta(rid, text, toks[at:at + c]))
            at += c
        return out + self.full


@message("error")
class ErrorReply:
    request_id: str | None
    code: int
    message: str
    param: str | None = None      # a 400's field at fault (a Generate field)


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
    user: str | None = None
    key_hash: str | None = None   # Generate's, for the step log
    # a digest of the request's salts (frontend/cache_salt.py), never the raw salt
    cache_salt: str | None = None
    embed: bool = False           # Generate's: prefill only, pooled (core/sched_types.py Request)


@message("abort_req")
class AbortRequest:
    fid: int


@message("stop_req")
class StopRequest:
    """A stop string ended the request after its first num_tokens generated tokens: the
    core finishes it with reason "stop" (its later tokens, if any, are dropped)."""
    fid: int
    num_tokens: int


@message("stats_query")
class StatsQuery:
    qid: int


@message("hello")
class Hello:
    """A frontend (re)started, or it (re)takes this core as a fresh replica: a core greeted
    with a (pid, epoch) other than the last aborts every request it holds (the frontend
    has forgotten them) and answers CoreReady with this epoch once its engine runs. The
    frontend counts epochs; a repeated Hello (same pid and epoch) only gets CoreReady."""
    pid: int
    epoch: int = 0


@message("drain")
class Drain:
    """The frontend stops accepting; the core finishes what runs."""
    pass


@message("rejected")
class Rejected:
    fid: int
    code: int
    message: str
    param: str | None = None      # a 400's field at fault (AdmitError.param)


@message("events")
class StepEvents:
    """One step's output for the frontend: token i of the step belongs to fids[i]."""
    fids: I32
    tokens: I32
    finished: list[list[Any]]     # [[fid, reason, metrics], ...], reason "stop" | "length" | "abort"
    logprobs: F64 = field(default_factory=F64)          # empty, or one per token (NaN: not asked)
    top_logprobs: list[Any] = field(default_factory=list)  # empty, or per token None | [[id, lp], ...]
    # [[fid, first prompt position, [[logprob, rank, [[id, lp], ...]], ...]], ...]
    prompt_logprobs: list[Any] = field(default_factory=list)
    # embeddings: embed_fids[i]'s vector is embeddings[i*d:(i+1)*d], d = len // len(fids)
    embed_fids: I32 = field(default_factory=I32)
    embeddings: F32 = field(default_factory=F32)


@message("core_stats")
class CoreStats:
    qid: int
    stats: dict


@message("core_ready")
class CoreReady:
    """`epoch`: the last Hello's; the frontend routes to the core only once it answers the
    Hello it sent last (by then every request of an earlier epoch is aborted)."""
    info: ModelInfo
    pid: int
    worker_pid: int
    epoch: int = 0


@message("beat")
class Beat:
    """A core is alive (every BEAT_S, also mid-step; local cores too): the frontend finds a
    core silent past its deadline stalled or dead. From an unknown joined replica it asks
    the frontend for a Hello."""
    pid: int


@message("leave")
class Leave:
    """A joined replica's core is stopping: the frontend re-sends its requests elsewhere."""
    pid: int


@message("join_refused")
class JoinRefused:
    """The frontend will not route to this replica (it serves another model); the core
    exits."""
    reason: str


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
    gen_index[j]-th generated token of its request. sample_offset, empty (all 0) or one
    per sample row: row j samples the query token sample_offset[j] before its sequence's
    last (a decode verifying k drafts samples each of its k+1 tokens; docs/design/scheduler.md,
    "Speculative decoding"). With a draft model the worker proposes the drafts itself:
    draft_seqs lists the sequences (batch indices) whose k query tokens after their first
    are placeholders (negative); the draft model has seen their tokens before the ones in
    draft_context[draft_context_start[i]:draft_context_start[i+1]] (the context it lacks,
    which ends just before the sequence's first query token), and the worker writes its
    drafts in place of the placeholders before the forward (worker/draft.py).

    The logits processors' columns are each either empty (no row of the step uses the
    feature) or one entry per sample row: min_p; presence, frequency and repetition
    penalties over row j's tokens history[history_start[j]:history_start[j+1]] (prompt and
    generated, its first history_prompt[j] are the prompt; rows without penalties have an
    empty range); banned token ids banned[banned_start[j]:banned_start[j+1]] (min_tokens);
    logprobs[j] = -1 (none) or k (the chosen token's log-probability and the top k).

    Prompt logprobs (docs/design/worker.md, "Prompt logprobs"), empty unless a sequence asks:
    query token prompt_rows[m] scores the prompt token prompt_targets[m] (the one after it)
    and returns its prompt_top[m] best alternatives.

    Structured outputs (docs/structured.md), empty unless a row is constrained:
    grammar[j] is row j's constraint key ("" for none), its generated tokens so far are
    grammar_tokens[grammar_start[j]:grammar_start[j+1]], and grammar_specs holds
    [key, kind, text] of each constraint whose row samples a request's first token since it
    was (re)admitted, so that a worker that lacks it (new, restarted, replaying) can build it.

    Embeddings (docs/design/worker.md, "Embeddings"), empty unless a sequence pools: query
    token pool_rows[m]'s final hidden state (after the model's last norm), L2-normalised,
    is returned; no sample row is that sequence's.

    Overlapped scheduling (docs/design/overlap.md, "Overlapped scheduling"): a negative entry
    -1 - j of input_ids, history or grammar_tokens stands for the token sampled by row j of step
    `prev_step`, which the worker fills in from its own last StepResult before the forward.
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
    min_p: F64 = field(default_factory=F64)
    presence: F64 = field(default_factory=F64)
    frequency: F64 = field(default_factory=F64)
    repetition: F64 = field(default_factory=F64)
    history: I32 = field(default_factory=I32)
    history_start: I32 = field(default_factory=I32)
    history_prompt: I32 = field(default_factory=I32)
    banned: I32 = field(default_factory=I32)
    banned_start: I32 = field(default_factory=I32)
    logprobs: I32 = field(default_factory=I32)
    prev_step: int = -1
    prompt_rows: I32 = field(default_factory=I32)
    prompt_targets: I32 = field(default_factory=I32)
    prompt_top: I32 = field(default_factory=I32)
    grammar: list[str] = field(default_factory=list)
    grammar_tokens: I32 = field(default_factory=I32)
    grammar_start: I32 = field(default_factory=I32)
    grammar_specs: list[list[str]] = field(default_factory=list)
    sample_offset: I32 = field(default_factory=I32)
    draft_seqs: I32 = field(default_factory=I32)
    draft_context: I32 = field(default_factory=I32)
    draft_context_start: I32 = field(default_factory=I32)
    pool_rows: I32 = field(default_factory=I32)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@message("step_result")
class StepResult:
    """tokens: one per sample row, in sample_rows order. When the batch asked for logprobs:
    logprobs has one per sample row (NaN where the row did not ask), and the top
    alternatives of each asking row (k = batch.logprobs[j] of them, rows in order) are
    flattened into top_ids / top_logprobs.

    Prompt logprobs, one per batch.prompt_rows entry: the target's logprob and rank (1 =
    best), and each row's prompt_top[m] best alternatives flattened in row order.

    drafts: the draft model's drafts for batch.draft_seqs, k per sequence in that order,
    as they were written into its input_ids (empty: none).

    pooled: one vector per batch.pool_rows entry, in that order, hidden_size floats each."""
    step: int
    tokens: I32
    logprobs: F64 = field(default_factory=F64)
    top_ids: I32 = field(default_factory=I32)
    top_logprobs: F64 = field(default_factory=F64)
    prompt_logprobs: F64 = field(default_factory=F64)
    prompt_ranks: I32 = field(default_factory=I32)
    prompt_top_ids: I32 = field(default_factory=I32)
    prompt_top_logprobs: F64 = field(default_factory=F64)
    drafts: I32 = field(default_factory=I32)
    pooled: F32 = field(default_factory=F32)


@message("step_alive")
class StepAlive:
    """Worker -> core, while step `step` runs: it still computes (worker/step_pulse.py).
    The core's step timeout counts from the last of these, so a long step lives and a
    silent one (stopped, deadlocked) is replaced."""
    step: int
    pid: int


@message("worker_ready")
class WorkerReady:
    info: ModelInfo
    pid: int


@message("shutdown")
class Shutdown:
    pass


@message("prepare_grammar")
class PrepareGrammar:
    """Core -> worker: build constraint `key`'s grammar (kind, text) off the step path; the
    core holds the requests under it until GrammarReady (docs/structured.md, "Built before
    the step"). A key the worker holds already is answered at once."""
    key: str
    kind: str
    text: str


@message("grammar_ready")
class GrammarReady:
    """Worker -> core: the worker `pid` holds `key`'s grammar now (built, or failed to build:
    a matcher in an error state, which allows EOS only)."""
    key: str
    pid: int


@message("compile_job")
class CompileJob:
    """Frontend -> its compile process (frontend/compile_process.py): check that the
    constraint (kind, text) compiles."""
    kind: str
    text: str


@message("compile_verdict")
class CompileVerdict:
    """Compile process -> frontend: why the constraint does not compile (None: it does) and
    the CPU time its compile took, in ms."""
    error: str | None
    ms: float
