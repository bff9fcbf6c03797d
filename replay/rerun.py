"""scripts/replay request LOG ID --rerun: run one logged request again, alone, with the model
(its prompt, its sampling, its seed) and compare its tokens with the recording.

On a log made with --batch-invariant (meta model_info.batch_invariant; the re-run uses the
mode too) every token matches bit for bit: a row's logits do not depend on the batch it ran
in (docs/design/cpu-paths.md, "Batch-invariant mode"). Without the mode a request whose top two logits
nearly tie may differ; the first differing token is reported. The step log records tokens,
not logprobs, so tokens are what is compared.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from core.config import engine_from_meta
from core.ipc.protocol import SamplingParams
from core.sched import AdmitError, Request, TokenEvent
from core.speculate import kept_outputs
from replay.logfile import DamagedLog, LogFile


@dataclass
class Rerun:
    logged: list[int]
    again: list[int]

    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.logged, self.again)):
            if a != b:
                return i
        return None if len(self.logged) == len(self.again) else min(len(self.logged),
                                                                     len(self.again))


def logged_tokens(log: LogFile, seq_id: int) -> list[int]:
    """The request's output as its finish recorded it; for one unfinished, the tokens the
    log's steps gave it, in order (an overlapped log also holds the token sampled after a
    stop token, which its finish drops: docs/design/overlap.md, "Overlapped scheduling")."""
    out = log.requests[seq_id].get("output_tokens")
    if out is not None:
        return list(out)
    return [tok for row in log.steps() for sid, tok, _ in kept_outputs(row.schedule, row.outputs) if sid == seq_id]


def rerun(log: LogFile, seq_id: int, runner) -> Rerun:
    """The request alone in an engine configured as the log's, for as many tokens as the
    log holds (its EOS and stop tokens still end it)."""
    r = log.requests[seq_id]
    logged = logged_tokens(log, seq_id)
    s = dict(r["sampling"])
    ignore_eos = s.pop("ignore_eos", False)
    embed = s.pop("embed", False)
    engine = engine_from_meta(log.meta, runner)
    try:
        engine.add(Request(list(r["prompt_tokens"]), max(1, len(logged)), r["priority"],
                           cache_salt=r["cache_salt"], embed=embed),
                   SamplingParams(**s), ignore_eos=ignore_eos)
    except AdmitError as e:
        raise DamagedLog(f"{log.path}: request {seq_id} cannot run again: an engine"
                         f" configured as the log's refuses it ({e})") from None
    again = []
    while engine.sched.has_unfinished():
        again += [ev.token for ev in engine.step().events if isinstance(ev, TokenEvent)]
    return Rerun(logged, again)


def main(log: LogFile, seq_id: int, device: str | None = None, dtype: str | None = None) -> int:
    """The `request --rerun` command: 0 all tokens match, 1 one differs, 2 no such request,
    3 the model cannot be had here."""
    from replay.model import ModelUnavailable, runner_for
    if seq_id not in log.requests:
        print(f"error: request {seq_id} is not in this log", file=sys.stderr)
        return 2
    log.check_steps()
    try:
        runner = runner_for(log.meta, device, dtype)
    except ModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    mode = "batch-invariant" if runner.info.batch_invariant else "not batch-invariant"
    res = rerun(log, seq_id, runner)
    where = f"request {seq_id} re-run alone ({mode}, {runner.info.device})"
    i = res.first_difference()
    if i is None:
        print(f"{where}: all {len(res.logged)} tokens match the log (the log holds tokens,"
              " not logprobs)")
        return 0
    got = res.again[i] if i < len(res.again) else "the end"
    want = res.logged[i] if i < len(res.logged) else "the end"
    print(f"{where}: token {i} differs: re-run {got} != log {want} "
          f"({i} tokens matched before it)")
    if not runner.info.batch_invariant:
        print("  the log was made without --batch-invariant: a request's logits then depend "
              "on its batch, and near-tied tokens can flip")
    return 1
