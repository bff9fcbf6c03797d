"""Speculative decoding in a what-if (docs/design/whatif.md, "Speculative decoding in a
what-if"): whether the simulated scheduler drafts, with how many drafts and up to which
batch, and when a log cannot tell what speculation would do.

The prediction is exact only where the recorded tokens are the ones plain decoding gives
with drafts verified: the n-gram proposer (a function of the tokens, core/ngram.py; a draft
model's drafts need the model), the log's own tokens (a CSV trace has made-up ones) and a
worker in the batch-invariant mode (off it the live core never speculates, and a verified
row could differ from the decode row the log holds).
"""
from __future__ import annotations

from core.config import CoreConfig
from core.bounds import MAX_NUM_DRAFT
from replay.trace import TraceError

PROPOSERS = ("ngram", "off")   # --speculative's values a what-if can predict


def drafting(meta: dict, knobs, tokens: bool = True) -> tuple[int, int]:
    """(num_draft, spec_max_batch) for the simulated scheduler, num_draft 0 without
    speculation: the log's, changed by the knobs `speculative`, `num_draft` and
    `spec_max_batch`. `tokens`: the traffic holds the recorded tokens (not a CSV trace's)."""
    sc = meta["sched_config"]
    logged = sc.get("num_draft", 0)
    kind = knobs.speculative
    if kind is not None and kind not in PROPOSERS:
        raise TraceError(f"--speculative {kind}: only 'ngram' (prompt lookup) can be predicted"
                         " (a draft model's drafts need the model); 'off' turns it off")
    if kind == "ngram" and not tokens:
        raise TraceError("--speculative with --trace: a CSV trace has no tokens to draft"
                         " from; predict a log instead")
    if kind is None and logged > 0 and sc.get("draft_model"):
        raise TraceError("this log drafted with a draft model, whose drafts need the model:"
                         " pass --speculative off (or ngram) to predict it another way")
    on = kind == "ngram" or (kind is None and logged > 0 and tokens)
    if not on:
        if knobs.num_draft is not None or knobs.spec_max_batch is not None:
            raise TraceError("--num-draft and --spec-max-batch need speculation: add"
                             " --speculative ngram")
        return 0, sc.get("spec_max_batch", CoreConfig.spec_max_batch)
    if meta["model_info"].get("batch_invariant") is not True:
        raise TraceError("speculation cannot be predicted from this log: its worker ran"
                         " without the batch-invariant mode (meta model_info batch_invariant),"
                         " so its tokens need not be the ones verified drafts would give")
    k = knobs.num_draft if knobs.num_draft is not None else logged or CoreConfig.num_draft
    batch = (knobs.spec_max_batch if knobs.spec_max_batch is not None
             else sc.get("spec_max_batch", CoreConfig.spec_max_batch))
    if not 1 <= k <= MAX_NUM_DRAFT:
        raise TraceError(f"--num-draft must be in [1, {MAX_NUM_DRAFT}], got {k}")
    if batch < 1:
        raise TraceError(f"--spec-max-batch must be at least 1, got {batch}")
    return k, batch
