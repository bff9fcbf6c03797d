"""A step log's rows and meta, read with their types checked (replay/damage.py)."""
from __future__ import annotations

from dataclasses import fields
from operator import itemgetter

from core.ipc.protocol import CONSTRAINT_KINDS
from core.logrecords import EmbeddingRecord, PromptLogprobsRecord, StepRecord, is_clock, is_json
from core.sched import SchedPolicy, SchedulerConfig
from core.bounds import MAX_CACHE_SALT_CHARS, MAX_NUM_DRAFT
from core.sched_types import FINISH_REASONS
from core.speculate import PENDING
from replay.bounds import Bounds, check_request, meta_bounds
from replay.damage import (DamagedLog, boolean, clock, int_list, integer, mapping, number,
                           one_of, optional, parsed, rows, text, within)

# stop: a stop string ended it; abandon: an overlapped step dropped unlaunched (core/overlap.py)
INPUT_KINDS = {"add", "abort", "stop", "restart", "abandon"}
SAMPLING = {"temperature": number, "top_p": number, "top_k": integer,
            "seed": lambda v, w: optional(integer, v, w), "ignore_eos": boolean,
            "min_p": number, "presence_penalty": number, "frequency_penalty": number,
            "repetition_penalty": number, "min_tokens": lambda v, w: integer(v, w, 0),
            "stop_token_ids": lambda v, w: optional(int_list, v, w, 0),
            "logprobs": lambda v, w: optional(integer, v, w, 0),
            "prompt_logprobs": lambda v, w: optional(integer, v, w, 0),
            "constraint": lambda v, w: optional(_constraint, v, w),
            "speculative": boolean, "embed": boolean}
OPTIONAL_SCHED = {"aging_steps", "preempt_margin"}  # None or a positive int
# speculative decoding's (logs made before it lack them: no speculation), and their floor
SPEC_SCHED = {"num_draft": 0, "spec_max_batch": 1}
_FIRST = itemgetter(0)
META = ("model", "block_size", "num_blocks", "seed", "model_info", "sched_config", "prefill")
QUANT_MODES = {"gguf", "q8_0", "q4_0", "none"}   # worker/quantized.py


def _quantization(v, where: str) -> dict:
    q = mapping(v, where)   # {} from a worker with no weights (the null model)
    optional(lambda m, w: one_of(m, w, QUANT_MODES), q.get("mode"), f"{where} mode")
    for name, qtype in mapping(q.get("layers", {}), f"{where} layers").items():
        text(qtype, f"{where} layers {name}")
    mapping(q.get("prefill", {}), f"{where} prefill")   # --prefill-bf16's (worker/quantized.py)
    mapping(q.get("activations", {}), f"{where} activations")   # --int8-activations'
    return q


# model_info's other keys (older logs lack some): how each is read
MODEL_INFO = {"dtype": text, "device": text, "tokenizer": text, "model": text,
              "tp": lambda v, w: integer(v, w, 1), "batch_invariant": boolean,
              "num_blocks": integer, "block_size": integer,
              "quantization": _quantization, "draft": text}


def check_meta(meta: dict) -> Bounds:
    """The keys replay needs to rebuild the engine, with their types; the bounds the log's
    values must keep (replay/bounds.py)."""
    for key in META:
        if key not in meta:
            raise DamagedLog(f"meta has no key {key!r}")
    text(meta["model"], "meta model")
    integer(meta["block_size"], "meta block_size", 1)
    integer(meta["num_blocks"], "meta num_blocks", 1)
    integer(meta["seed"], "meta seed")
    info = mapping(meta["model_info"], "meta model_info",
                   ("eos_ids", "max_model_len", "vocab_size"))
    int_list(info["eos_ids"], "meta model_info eos_ids")
    integer(info["max_model_len"], "meta model_info max_model_len", 1)
    for key, read in MODEL_INFO.items():
        optional(read, info.get(key), f"meta model_info {key}")
    for key, value in mapping(meta.get("versions", {}), "meta versions").items():
        optional(text, value, f"meta versions {key}")
    _check_sched_config(mapping(meta["sched_config"], "meta sched_config",
                                [f.name for f in fields(SchedulerConfig)
                                 if f.name not in SPEC_SCHED and f.name != "draft_model"]))
    pf = mapping(meta["prefill"], "meta prefill", ("kind", "max_chunk"))
    one_of(pf["kind"], "meta prefill kind", {"chunked", "whole"})
    integer(pf["max_chunk"], "meta prefill max_chunk", 1)
    for key in ("overlap", "prefix_cache"):
        boolean(meta.get(key, False), f"meta {key}")
    return meta_bounds(meta)


def _check_sched_config(sc: dict) -> None:
    one_of(sc["policy"], "meta sched_config policy", {p.name for p in SchedPolicy})
    for f in fields(SchedulerConfig):
        if f.name == "policy":
            continue
        where = f"meta sched_config {f.name}"
        if f.name == "draft_model":   # a bool, absent from logs before the draft model
            optional(boolean, sc.get(f.name), where)
        elif f.name in SPEC_SCHED:
            if f.name in sc:
                integer(sc[f.name], where, SPEC_SCHED[f.name],
                        MAX_NUM_DRAFT if f.name == "num_draft" else None)
        elif f.name in OPTIONAL_SCHED:
            optional(integer, sc[f.name], where, 1)
        else:
            integer(sc[f.name], where, 1)


def request_row(r: dict, b: Bounds) -> dict:
    seq_id = integer(r["id"], "a request id", 0)
    w = f"request {seq_id}:"
    prompt = b.tokens(parsed(r["prompt_tokens"], f"{w} prompt_tokens"), f"{w} prompt_tokens")
    if not prompt:
        raise DamagedLog(f"{w} empty prompt")
    out = r["output_tokens"]
    row = {"id": seq_id,
           "client_request_id": optional(text, r["client_request_id"], f"{w} client_request_id"),
           "arrival_step": integer(r["arrival_step"], f"{w} arrival_step", 0),
           "prompt_tokens": prompt,
           "max_tokens": integer(r["max_tokens"], f"{w} max_tokens", 1),
           "priority": integer(r["priority"], f"{w} priority"),
           "sampling": _sampling(parsed(r["sampling"], f"{w} sampling"), f"{w} sampling"),
           "finish_step": optional(integer, r["finish_step"], f"{w} finish_step", 0),
           "finish_reason": optional(one_of, r["finish_reason"], f"{w} finish_reason",
                                     FINISH_REASONS),
           "output_tokens": None if out is None else b.tokens(
               parsed(out, f"{w} output_tokens"), f"{w} output_tokens"),
           "user": optional(text, r.get("user"), f"{w} user"),
           "arrival_time": optional(clock, r.get("arrival_time"), f"{w} arrival_time"),
           "key_hash": optional(text, r.get("key_hash"), f"{w} key_hash"),
           "cache_salt": optional(_salt, r.get("cache_salt"), f"{w} cache_salt")}
    check_request(row, b, w)
    return row


def _salt(v, where: str) -> str:
    """The digest of a request's cache salts, as long as the scheduler takes one."""
    if len(text(v, where)) > MAX_CACHE_SALT_CHARS:
        raise DamagedLog(f"{where} is {len(v)} characters, over {MAX_CACHE_SALT_CHARS}")
    return v


def _sampling(doc, where: str) -> dict:
    for key, value in mapping(doc, where).items():
        read = SAMPLING.get(key)
        if read is None:
            raise DamagedLog(f"{where} has an unknown key {key!r}")
        read(value, f"{where} {key}")
    return doc


def _constraint(doc, where: str) -> dict:
    """A structured-output constraint: {"kind": one of CONSTRAINT_KINDS, "text": a string}."""
    c = mapping(doc, where, ("kind", "text"))
    if set(c) != {"kind", "text"}:
        raise DamagedLog(f"{where} must hold exactly kind and text")
    one_of(c["kind"], f"{where} kind", CONSTRAINT_KINDS)
    text(c["text"], f"{where} text")
    return c


def input_row(step, seq, kind, seq_id, requests: dict) -> tuple[int, str, int | None]:
    step = integer(step, "an input's step", 0)
    w = f"input {seq} before step {step}"
    one_of(kind, f"{w} kind", INPUT_KINDS)
    if kind in ("restart", "abandon"):
        return step, kind, None
    if seq_id not in requests:
        raise DamagedLog(f"{w} ({kind}) names request {_name(seq_id)}, which the requests"
                         " table lacks")
    return step, kind, seq_id


def step_row(row: tuple, requests: dict, b: Bounds) -> StepRecord:
    """A steps row, its columns in StepRecord's order, with every value checked: the step
    number, then the JSON columns' shapes, bounds and the ids they name, then the other
    columns."""
    v = dict(zip(_STEP_NAMES, row))
    step = integer(v[StepRecord.key], "a step number", 0)
    w = f"step {step}:"
    for name, shape in _STEP_JSON:
        v[name] = shape(parsed(v[name], f"{w} {name}"), f"{w} {name}", b)
    schedule, outputs = v["schedule"], v["outputs"]
    ids = set(map(_FIRST, schedule["prefill"])).union(
        schedule["decode"], schedule["preempted"], map(_FIRST, outputs))
    missing = ids.difference(requests)
    if missing:
        raise DamagedLog(f"{w} names request {min(missing)}, which the requests table lacks")
    for name, read in _STEP_SCALARS:
        read(v[name], f"{w} {name}")
    integer(v["free_blocks"], f"{w} free_blocks", 0, b.num_blocks)
    return StepRecord(**v)


def prompt_row(row: tuple, requests: dict, b: Bounds) -> PromptLogprobsRecord:
    """A prompt_logprobs row: [logprob, rank, [[token id, logprob], ...]] per position."""
    step, seq_id, first, doc = row
    step = integer(step, "a prompt_logprobs step", 0)
    w = f"prompt logprobs of step {step}:"
    if seq_id not in requests:
        raise DamagedLog(f"{w} names request {_name(seq_id)}, which the requests table lacks")
    first = integer(first, f"{w} first", 1, b.max_model_len)
    entries = parsed(doc, f"{w} entries")
    if type(entries) is not list:
        raise DamagedLog(f"{w} entries is not a list")
    for k, e in enumerate(entries):
        where = f"{w} position {first + k}"
        if type(e) is not list or len(e) != 3:
            raise DamagedLog(f"{where} is not [logprob, rank, alternatives]")
        number(e[0], f"{where} logprob")
        integer(e[1], f"{where} rank", 1)
        for alt in e[2] if type(e[2]) is list else [None]:
            if type(alt) is not list or len(alt) != 2:
                raise DamagedLog(f"{where} alternatives hold {alt!r:.60}, not [id, logprob]")
            integer(alt[0], f"{where} alternative id", 0, b.vocab_size - 1)
            number(alt[1], f"{where} alternative logprob")
    return PromptLogprobsRecord(step, seq_id, first, entries)


def embedding_row(row: tuple, requests: dict) -> EmbeddingRecord:
    """An embeddings row: the vector's length and the sha256 of its float32 bytes."""
    step, seq_id, dims, digest = row
    step = integer(step, "an embeddings step", 0)
    w = f"embedding of step {step}:"
    if seq_id not in requests:
        raise DamagedLog(f"{w} names request {_name(seq_id)}, which the requests table lacks")
    dims = integer(dims, f"{w} dims", 1, 1 << 20)
    if type(digest) is not str or len(digest) != 64:
        raise DamagedLog(f"{w} sha256 is not 64 hex digits")
    return EmbeddingRecord(step, seq_id, dims, digest)


def _schedule(doc, where: str, b: Bounds) -> dict:
    mapping(doc, where, ("prefill", "decode", "preempted"))
    prefill = rows(doc["prefill"], f"{where} prefill", (int, int, int, bool))
    within(prefill, f"{where} prefill", 1, "start", 0, b.max_model_len)
    within(prefill, f"{where} prefill", 2, "length", 0, b.max_model_len)
    int_list(doc["decode"], f"{where} decode")
    int_list(doc["preempted"], f"{where} preempted")
    int_list(doc.get("pooled", []), f"{where} pooled")
    if "cached" in doc:   # prefix-cache hits of the step's admissions
        cached = rows(doc["cached"], f"{where} cached", (int, int))
        within(cached, f"{where} cached", 1, "tokens", 0, b.max_model_len)
    if "drafts" in doc:   # decodes verified with drafts (docs/design/scheduler.md, "Speculative decoding")
        for seq_id, drafts in rows(doc["drafts"], f"{where} drafts", (int, list)):
            # an abandoned step's draft-model drafts stay PENDING (core/speculate.py)
            b.tokens([t for t in drafts if t != PENDING], f"{where} drafts of request {seq_id}")
            integer(len(drafts), f"{where} drafts of request {seq_id}", 1, MAX_NUM_DRAFT)
    if "accepted" in doc:
        accepted = rows(doc["accepted"], f"{where} accepted", (int, int))
        within(accepted, f"{where} accepted", 1, "drafts kept", 0, MAX_NUM_DRAFT)
    return doc


def _outputs(doc, where: str, b: Bounds) -> list:
    out = rows(doc, where, (int, int, bool))
    within(out, where, 1, "token", 0, b.vocab_size - 1)
    return out


# How step_row reads each column of StepRecord: a JSON column by its shape, any other by
# its type (the integers are counts or step numbers: never negative).
_SHAPES = {"schedule": _schedule, "outputs": _outputs}
_READERS = {int: lambda v, where: integer(v, where, 0), float: number, str: text}
_STEP_NAMES = [f.name for f in fields(StepRecord)]
_STEP_JSON = [(f.name, _SHAPES[f.name]) for f in fields(StepRecord) if is_json(f)]
_STEP_SCALARS = [(f.name, clock if is_clock(f) else _READERS[f.type])
                 for f in fields(StepRecord) if not is_json(f) and f.name != StepRecord.key]


def gap_message(first, last, records, reason) -> str:
    return (f"steps {first}..{last} were not logged ({records} records dropped: {reason});"
            " replay cannot go past them")


def _name(v) -> str:
    return str(v) if type(v) is int else repr(v)
