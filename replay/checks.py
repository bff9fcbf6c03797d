"""One logged step against its re-run: the checks replay/verify.py runs on each step, and
replay/ahead.py in an overlapped log's order. The first that fails is the Divergence."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from core.batch import sampled_ids
from core.state_hash import schedule_json
from core.logrecords import StepRecord


@dataclass
class Divergence:
    step: int
    what: str        # "schedule" | "outputs" | "tokens" | "prompt_logprobs" | "embeddings"
    #                  | "hash" | "input" | "steps"
    diffs: list[str] = field(default_factory=list)


def _diff_schedule(got: dict, want: dict) -> list[str]:
    out = []
    for key in ("prefill", "decode", "preempted", "cached", "drafts", "pooled"):
        if got.get(key, []) != want.get(key, []):
            out.append(f"{key}: replay {got.get(key, [])} != log {want.get(key, [])}")
    return out


def check_plan(engine, row: StepRecord, runner):
    """Plan the row's step: (batch, the logged tokens or None for an abandoned step,
    Divergence or None)."""
    batch = engine.plan(build=runner is not None)
    want = {k: v for k, v in row.schedule.items() if k != "accepted"}   # known at commit:
    engine.fill_drafts(want.get("drafts", ()))   # a draft model's: the re-run checks them
    got = schedule_json(engine.last_schedule, engine.last_hits)
    if got != want:                                                      # the hash checks it
        return batch, None, Divergence(row.step, "schedule", _diff_schedule(got, want))
    logged = [tok for _, tok, _ in row.outputs]
    ids = sampled_ids(engine.last_schedule)
    if not logged and ids:
        logged = None  # the worker died during this step: the core abandoned it
    elif [o[0] for o in row.outputs] != ids:
        return batch, None, Divergence(row.step, "outputs", [
            f"the log's outputs are for requests {[o[0] for o in row.outputs]}, the replay"
            f" samples {ids}"])
    return batch, logged, None


def check_tokens(batch, logged, row: StepRecord, runner):
    """Re-run the row's batch: (Divergence or None, the worker's StepResult or None)."""
    if batch is None or not batch.num_seqs or logged is None:
        return None, None
    run = getattr(runner, "run", None)   # test runners may only have execute
    result = run(batch) if run is not None else None
    tokens = list(result.tokens if result is not None else runner.execute(batch))
    if result is not None and len(result.drafts):
        want = [t for _, d in row.schedule.get("drafts", ()) for t in d]
        if list(result.drafts) != want:
            return Divergence(row.step, "drafts", [
                f"the draft model proposed {list(result.drafts)}, the log {want}"]), result
    if tokens != logged:
        bad = [f"request {o[0]}: replay token {t} != log {o[1]}"
               for t, o in zip(tokens, row.outputs) if t != o[1]]
        return Divergence(row.step, "tokens", bad), result
    return None, result


def check_prompt_logprobs(done, step: int, logged: dict) -> Divergence | None:
    """The step's prompt logprobs (its StepCommit's, from the re-run) against the log's
    (LogFile.prompt_logprobs()[step]), bit for bit."""
    got = {seq_id: (first, entries) for seq_id, first, entries in done.prompt_logprobs}
    if got == logged:
        return None
    diffs = []
    for seq_id in sorted(set(got) | set(logged)):
        a, b = got.get(seq_id), logged.get(seq_id)
        if a != b:
            diffs.append(f"request {seq_id}: replay {_positions(a)} != log {_positions(b)}"
                         + _first_difference(a, b))
    return Divergence(step, "prompt_logprobs", diffs)


def check_embeddings(done, step: int, logged: dict) -> Divergence | None:
    """The step's vectors (its StepCommit's, from the re-run) against the log's digests
    (LogFile.embeddings()[step]: seq_id -> (dims, sha256)), bit for bit."""
    got = {seq_id: (len(v), hashlib.sha256(v).hexdigest())
           for seq_id, v in done.embeddings if v is not None}
    if got == logged:
        return None
    diffs = [f"request {i}: replay {got.get(i)} != log {logged.get(i)}"
             for i in sorted(set(got) | set(logged)) if got.get(i) != logged.get(i)]
    return Divergence(step, "embeddings", diffs)


def _positions(v) -> str:
    return "none" if v is None else f"positions {v[0]}..{v[0] + len(v[1]) - 1}"


def _first_difference(a, b) -> str:
    if a is None or b is None or a[0] != b[0]:
        return ""
    k = next((k for k, (x, y) in enumerate(zip(a[1], b[1])) if x != y), None)
    return "" if k is None else f"; position {a[0] + k}: replay {a[1][k]} != log {b[1][k]}"


def check_hash(engine, row: StepRecord) -> Divergence | None:
    if engine.last_hash != row.hash:
        return Divergence(row.step, "hash", [f"state hash {engine.last_hash} != log {row.hash}"])
    return None


def check_step(engine, row: StepRecord, runner, prompt: dict,
               embedded: dict | None = None) -> Divergence | None:
    """`embedded`: the log's embeddings (LogFile.embeddings()): without a model, which
    pooled requests got their vector; with one, the digests the vectors must have."""
    batch, logged, div = check_plan(engine, row, runner)
    result = None
    if div is None:
        div, result = check_tokens(batch, logged, row, runner)
    if div is not None:
        return div
    vectors = (embedded or {}).get(row.step, {})
    done = engine.commit(logged, result, pooled=vectors)
    return check_model_products(done, row.step, runner, prompt, vectors) or check_hash(engine, row)


def check_model_products(done, step: int, runner, prompt: dict,
                         vectors: dict) -> Divergence | None:
    """With a model: the step's prompt logprobs and embeddings against the log's."""
    if runner is None:
        return None
    return (check_prompt_logprobs(done, step, prompt.get(step, {}))
            or check_embeddings(done, step, vectors))
