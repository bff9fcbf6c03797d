"""A step log's rows and meta, read with their types checked (replay/damage.py)."""
from __future__ import annotations

from dataclasses import fields
from operator import itemgetter

from core.logrecords import PromptLogprobsRecord, StepRecord, is_json
from core.sched import SchedPolicy, SchedulerConfig
from replay.damage import (DamagedLog, boolean, int_list, integer, mapping, number, one_of,
                           optional, parsed, rows, text)

# stop: a stop string ended it; abandon: an overlapped step dropped unlaunched (core/overlap.py)
INPUT_KINDS = {"add", "abort", "stop", "restart", "abandon"}
FINISH_REASONS = {"stop", "length", "abort"}
SAMPLING = {"temperature": number, "top_p": number, "top_k": integer,
            "seed": lambda v, w: optional(integer, v, w), "ignore_eos": boolean,
            "min_p": number, "presence_penalty": number, "frequency_penalty": number,
            "repetition_penalty": number, "min_tokens": lambda v, w: integer(v, w, 0),
            "stop_token_ids": lambda v, w: optional(int_list, v, w, 0),
            "logprobs": lambda v, w: optional(integer, v, w, 0),
            "prompt_logprobs": lambda v, w: optional(integer, v, w, 0)}
OPTIONAL_SCHED = {"aging_steps", "preempt_margin"}  # None or a positive int
_FIRST = itemgetter(0)
META = ("model", "block_size", "num_blocks", "seed", "model_info", "sched_config", "prefill")


def check_meta(meta: dict) -> dict:
    """The keys replay needs to rebuild the engine, with their types."""
    for key in META:
        if key not in meta:
            raise DamagedLog(f"meta has no key {key!r}")
    text(meta["model"], "meta model")
    integer(meta["block_size"], "meta block_size", 1)
    integer(meta["num_blocks"], "meta num_blocks", 1)
    integer(meta["seed"], "meta seed")
    info = mapping(meta["model_info"], "meta model_info", ("eos_ids", "max_model_len"))
    int_list(info["eos_ids"], "meta model_info eos_ids")
    integer(info["max_model_len"], "meta model_info max_model_len", 1)
    mapping(meta.get("versions", {}), "meta versions")
    _check_sched_config(mapping(meta["sched_config"], "meta sched_config",
                                [f.name for f in fields(SchedulerConfig)]))
    pf = mapping(meta["prefill"], "meta prefill", ("kind", "max_chunk"))
    one_of(pf["kind"], "meta prefill kind", {"chunked", "whole"})
    integer(pf["max_chunk"], "meta prefill max_chunk", 1)
    if type(meta.get("overlap", False)) is not bool:
        raise DamagedLog(f"meta overlap must be true or false, got {meta['overlap']!r}")
    return meta


def _check_sched_config(sc: dict) -> None:
    one_of(sc["policy"], "meta sched_config policy", {p.name for p in SchedPolicy})
    for f in fields(SchedulerConfig):
        if f.name == "policy":
            continue
        where = f"meta sched_config {f.name}"
        if f.name in OPTIONAL_SCHED:
            optional(integer, sc[f.name], where, 1)
        else:
            integer(sc[f.name], where, 1)


def request_row(r: dict) -> dict:
    seq_id = integer(r["id"], "a request id", 0)
    w = f"request {seq_id}:"
    prompt = int_list(parsed(r["prompt_tokens"], f"{w} prompt_tokens"), f"{w} prompt_tokens", 0)
    if not prompt:
        raise DamagedLog(f"{w} empty prompt")
    out = r["output_tokens"]
    return {"id": seq_id,
            "client_request_id": optional(text, r["client_request_id"], f"{w} client_request_id"),
            "arrival_step": integer(r["arrival_step"], f"{w} arrival_step", 0),
            "prompt_tokens": prompt,
            "max_tokens": integer(r["max_tokens"], f"{w} max_tokens", 1),
            "priority": integer(r["priority"], f"{w} priority"),
            "sampling": _sampling(parsed(r["sampling"], f"{w} sampling"), f"{w} sampling"),
            "finish_step": optional(integer, r["finish_step"], f"{w} finish_step", 0),
            "finish_reason": optional(one_of, r["finish_reason"], f"{w} finish_reason",
                                      FINISH_REASONS),
            "output_tokens": None if out is None else int_list(
                parsed(out, f"{w} output_tokens"), f"{w} output_tokens", 0),
            "user": optional(text, r.get("user"), f"{w} user"),
            "arrival_time": optional(number, r.get("arrival_time"), f"{w} arrival_time")}


def _sampling(doc, where: str) -> dict:
    for key, value in mapping(doc, where).items():
        read = SAMPLING.get(key)
        if read is None:
            raise DamagedLog(f"{where} has an unknown key {key!r}")
        read(value, f"{where} {key}")
    return doc


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


def step_row(row: tuple, requests: dict) -> StepRecord:
    """A steps row, its columns in StepRecord's order, with every value checked: the step
    number, then the JSON columns' shapes and the ids they name, then the other columns."""
    v = dict(zip(_STEP_NAMES, row))
    step = integer(v[StepRecord.key], "a step number", 0)
    w = f"step {step}:"
    for name, shape in _STEP_JSON:
        v[name] = shape(parsed(v[name], f"{w} {name}"), f"{w} {name}")
    schedule, outputs = v["schedule"], v["outputs"]
    ids = set(map(_FIRST, schedule["prefill"])).union(
        schedule["decode"], schedule["preempted"], map(_FIRST, outputs))
    missing = ids.difference(requests)
    if missing:
        raise DamagedLog(f"{w} names request {min(missing)}, which the requests table lacks")
    for name, read in _STEP_SCALARS:
        read(v[name], f"{w} {name}")
    return StepRecord(**v)


def prompt_row(row: tuple, requests: dict) -> PromptLogprobsRecord:
    """A prompt_logprobs row: [logprob, rank, [[token id, logprob], ...]] per position."""
    step, seq_id, first, doc = row
    step = integer(step, "a prompt_logprobs step", 0)
    w = f"prompt logprobs of step {step}:"
    if seq_id not in requests:
        raise DamagedLog(f"{w} names request {_name(seq_id)}, which the requests table lacks")
    first = integer(first, f"{w} first", 1)
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
            integer(alt[0], f"{where} alternative id", 0)
            number(alt[1], f"{where} alternative logprob")
    return PromptLogprobsRecord(step, seq_id, first, entries)


def _schedule(doc, where: str) -> dict:
    mapping(doc, where, ("prefill", "decode", "preempted"))
    rows(doc["prefill"], f"{where} prefill", (int, int, int, bool))
    int_list(doc["decode"], f"{where} decode")
    int_list(doc["preempted"], f"{where} preempted")
    if "cached" in doc:   # prefix-cache hits of the step's admissions
        rows(doc["cached"], f"{where} cached", (int, int))
    return doc


def _outputs(doc, where: str) -> list:
    return rows(doc, where, (int, int, bool))


# How step_row reads each column of StepRecord: a JSON column by its shape, any other by
# its type (the integers are counts or step numbers: never negative).
_SHAPES = {"schedule": _schedule, "outputs": _outputs}
_READERS = {int: lambda v, where: integer(v, where, 0), float: number, str: text}
_STEP_NAMES = [f.name for f in fields(StepRecord)]
_STEP_JSON = [(f.name, _SHAPES[f.name]) for f in fields(StepRecord) if is_json(f)]
_STEP_SCALARS = [(f.name, _READERS[f.type]) for f in fields(StepRecord)
                 if not is_json(f) and f.name != StepRecord.key]


def gap_message(first, last, records, reason) -> str:
    return (f"steps {first}..{last} were not logged ({records} records dropped: {reason});"
            " replay cannot go past them")


def _name(v) -> str:
    return str(v) if type(v) is int else repr(v)
