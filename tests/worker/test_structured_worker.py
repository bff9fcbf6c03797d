"""Structured outputs in the worker, on the tiny random model (docs/structured.md): every
output is in its constraint's language and ends `stop` once the grammar is complete; the
mask changes nothing but the forbidden tokens; overlap, preemption and a matcher out of step
with the batch change no token."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from core.config import build_engine
from core.ipc.protocol import Constraint, SamplingParams
from core.sched import Finished, Request, SchedulerConfig
from worker.grammar import Grammars
from worker.load import make_runner

REGEX = r"[a-c]{2,4}-[0-9]{1,3}"
CHOICES = ["red", "green", "blue", "dark blue"]
# a random model fills a free string or number until max_tokens: every value is bounded here
_SHORT = {"type": "string", "maxLength": 6}
SCHEMAS = [
    {"type": "object", "properties": {"a": _SHORT, "b": {"type": "boolean"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "c": {"enum": ["x", "yy", "zzz"]}},
     "required": ["n", "c"], "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"in": {"type": "object", "properties": {"s": _SHORT},
                                             "required": ["s"], "additionalProperties": False}},
     "required": ["in"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def runner():
    return make_runner("tiny", num_blocks=128)


@pytest.fixture(scope="module")
def tok(runner):
    return AutoTokenizer.from_pretrained(runner.info.tokenizer)


def run(runner, reqs, *, overlap=False, num_blocks=128, max_seqs=16):
    """reqs: [(prompt, max_tokens, SamplingParams)] -> [(tokens, finish reason)]."""
    info = runner.info
    cfg = SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=256,
                          max_model_len=info.max_model_len)
    eng = build_engine(cfg, "chunked", 64, info.block_size, num_blocks, info.eos_ids, 0,
                       runner=runner, overlap=overlap)
    ids = [eng.add(Request(list(p), n), sp) for p, n, sp in reqs]
    reasons, out = {}, {}
    while eng.busy():
        outs = {i: live.output for i, live in eng.live.items()}
        for ev in eng.step().events:
            if isinstance(ev, Finished):
                reasons[ev.id], out[ev.id] = ev.reason.value, outs.get(ev.id, [])
    return [(out[i], reasons[i]) for i in ids], eng


def constrained(kind: str, text: str, **kw) -> SamplingParams:
    return SamplingParams(constraint=Constraint(kind, text), **kw)


def text_of(tok, ids, eos_ids) -> str:
    return tok.decode([t for t in ids if t not in eos_ids])


def prompt(i: int) -> list[int]:
    return [(7 * i + k) % 200 + 10 for k in range(5 + i % 7)]


def test_regex_choice_and_json_outputs_match_and_end_stop(runner, tok):
    eos = set(runner.info.eos_ids)
    cases = ([(REGEX, constrained("regex", REGEX))]
             + [(None, constrained("choice", json.dumps(CHOICES)))]
             + [(s, constrained("json", json.dumps(s))) for s in SCHEMAS]
             + [(REGEX, constrained("regex", REGEX, temperature=1.0, seed=5))])
    got, _ = run(runner, [(prompt(i), 80, sp) for i, (_, sp) in enumerate(cases)])
    for (want, sp), (ids, reason) in zip(cases, got):
        assert reason == "stop", (sp.constraint, ids)
        assert ids[-1] in eos
        text = text_of(tok, ids, eos)
        if sp.constraint.kind == "regex":
            assert re.fullmatch(want, text), text
        elif sp.constraint.kind == "choice":
            assert text in CHOICES
        else:
            jsonschema.validate(json.loads(text), want)


def test_unconstrained_rows_are_untouched(runner):
    """A batch mixing constrained and free rows gives the free rows what they get alone."""
    free = [(prompt(i), 12, SamplingParams()) for i in range(3)]
    alone, _ = run(runner, free)
    mixed, _ = run(runner, [free[0], (prompt(9), 40, constrained("regex", REGEX)), *free[1:]])
    assert [mixed[0], *mixed[2:]] == alone


def test_overlap_and_preemption_change_no_token(runner):
    reqs = [(prompt(i) * 5, 60, constrained("json", json.dumps(s)))   # 25-55 tokens
            for i, s in enumerate(SCHEMAS * 2)]
    plain, _ = run(runner, reqs)
    ahead, _ = run(runner, reqs, overlap=True)
    assert ahead == plain
    tight, eng = run(runner, reqs, num_blocks=14, max_seqs=8)   # preempts and recomputes
    assert eng.sched.stats().preemptions > 0
    assert tight == plain


def test_the_mask_only_sets_forbidden_tokens_to_minus_inf(runner):
    """What keeps the batch-invariant mode bitwise: allowed logits are the same bits."""
    from core.batch import layout
    c = Constraint("regex", REGEX)
    params = [SamplingParams(constraint=c), SamplingParams()]
    b = layout(0, 16, [0, 1], [[5, 6, 7], [8, 9]], [[0], [1]], 2, [], [0, 1], params, [0, 0])
    b.grammar_specs = [[c.key, c.kind, c.text]]
    g = Grammars(runner.info.tokenizer, runner.info.vocab_size, runner.info.eos_ids)
    logits = torch.randn(2, runner.info.vocab_size)
    out = g.mask(logits, b)
    assert torch.equal(out[1], logits[1])
    kept = out[0] != float("-inf")
    assert torch.equal(out[0][kept], logits[0][kept])
    allowed = {tok for tok in kept.nonzero().flatten().tolist()}
    assert allowed == {ord(ch) for ch in "abc"}   # the tiny tokenizer: ids 0..255 are bytes


def test_the_grammars_count_their_time_on_constrained_batches_only(runner):
    """spent_s is what the worker reports as a step's mask time (scripts/bench structured)."""
    from core.batch import layout
    c = Constraint("regex", REGEX)
    g = Grammars(runner.info.tokenizer, runner.info.vocab_size, runner.info.eos_ids)
    logits = torch.zeros(1, runner.info.vocab_size)
    free = layout(0, 16, [0], [[5, 6]], [[0]], 1, [], [0], [SamplingParams()], [0])
    g.mask(logits, free)
    assert g.spent_s == 0.0
    b = layout(0, 16, [0], [[5, 6]], [[0]], 1, [], [0], [SamplingParams(constraint=c)], [0])
    b.grammar_specs = [[c.key, c.kind, c.text]]
    g.mask(logits, b)
    first = g.spent_s
    g.mask(logits, b)
    assert 0 < first < g.spent_s


def test_a_matcher_out_of_step_is_rebuilt_from_the_batch(runner):
    """The batch is the truth: tokens that disagree with the kept matcher rebuild it."""
    from core.batch import layout
    c = Constraint("regex", REGEX)
    g = Grammars(runner.info.tokenizer, runner.info.vocab_size, runner.info.eos_ids)
    logits = torch.zeros(1, runner.info.vocab_size)

    def allowed(generated):
        toks = [5, *generated]
        b = layout(0, 16, [0], [toks], [[0]], 1, [], [0], [SamplingParams(constraint=c)],
                   [len(generated)])
        b.grammar_specs = [[c.key, c.kind, c.text]]
        return set((g.mask(logits, b)[0] == 0).nonzero().flatten().tolist())

    digits = {ord(d) for d in "0123456789"}
    assert allowed(list(b"ab")) == {ord(ch) for ch in "abc-"}
    assert allowed(list(b"ab-")) == digits
    assert allowed(list(b"a")) == {ord(ch) for ch in "abc"}    # rolled back: rebuilt
    assert allowed(list(b"ab-1")) == digits | set(runner.info.eos_ids)


@pytest.mark.slow   # two more model loads and two replays: ~60 s on the shared 2 cores
def test_a_constrained_run_with_preemption_replays_with_the_model(runner, tmp_path):
    """The log records each request's constraint: verify --with-model and request --rerun
    give the same tokens (the replaying runner builds the grammars from the batches)."""
    from dataclasses import replace

    from core.config import CoreConfig, log_meta
    from core.steplog import StepLog
    from replay.__main__ import main as replay_main
    info = replace(runner.info, num_blocks=14)
    cfg = CoreConfig("-", "-", "-", "-", max_seqs=8, max_batch_tokens=256, max_chunk=64)
    path = tmp_path / "structured.db"
    log = StepLog(str(path), log_meta(cfg, info))
    eng = cfg.make_engine(info, log)
    eng.runner = runner
    ids = [eng.add(Request(prompt(i) * 5, 60), constrained("json", json.dumps(s)))
           for i, s in enumerate(SCHEMAS * 2)]
    ids.append(eng.add(Request(prompt(3), 20), constrained("regex", REGEX, temperature=1.0)))
    try:
        while eng.busy():
            eng.step()
    finally:
        log.close()
    assert eng.sched.stats().preemptions > 0
    assert replay_main(["verify", "--with-model", str(path)]) == 0
    assert replay_main(["request", str(path), str(ids[-1]), "--rerun"]) == 0


def test_a_prompt_one_token_past_a_chunk_is_masked(runner, tok):
    """65 tokens in chunks of 64: the last prompt token is queried as a decode, and that row
    brings the spec (core/first_samples.py); the worker once lacked the grammar there."""
    got, _ = run(runner, [([(7 * k) % 200 + 10 for k in range(65)], 20,
                           constrained("regex", REGEX))])
    (ids, reason), = got
    assert reason == "stop" and re.fullmatch(REGEX, text_of(tok, ids, runner.info.eos_ids))
