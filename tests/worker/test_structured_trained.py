"""Structured outputs on the trained model (the `smollm2` preset: SmolLM2-135M-Instruct from its
Q4_1 GGUF, dequantized), docs/structured.md: chat prompts through the model's own template ask
for JSON, a regex's text or one of some choices, batched through the real scheduler; every
output ends `stop` and is in its constraint's language. Greedy output under a schema equals
transformers' `generate` masked by llguidance on the same weights, token for token."""
from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import llguidance.hf
import llguidance.torch
import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from core.ipc.protocol import Constraint, SamplingParams
from scripts.benchmarks._schemas import schemas
from worker.load import make_runner

from tests.gguf_files import registry_tokenizer
from tests.worker.test_structured_worker import run

SYSTEM = "You answer in JSON only."
# one task per shape of _schemas' ten (schema i gets TASKS[i % 10]): a 135M model asked only
# for "JSON matching this schema" fills free strings with one character until max_tokens
TASKS = (
    "Invent a person: their name and age.",
    "Name a large city and its population.",
    "Is the Earth round? Answer, and say how confident you are.",
    "List up to three fruits.",
    "Name a famous novel, its author and the year it was published.",
    "Is 17 a prime number? Say whether that is valid, with a short reason.",
    "Name a historical event and its date.",
    "How tall is a door?",
    "How do I boil an egg? Give the steps, each only a number n and a short text.",
    "Give the position of Paris on a map, labelled with its name.",
)
REGEXES = (
    ("What is today's date, as YYYY-MM-DD?", r"\d{4}-\d{2}-\d{2}"),
    ("What is the phone number of a pizza shop, as (555) 123-4567?", r"\(\d{3}\) \d{3}-\d{4}"),
    ("Name a colour in one word.", r"[A-Za-z]+"),
    ("What time is it, as HH:MM?", r"([01]\d|2[0-3]):[0-5]\d"),
    ("Give an email address for John.", r"[a-z]+@[a-z]+\.(com|org|net)"),
    ("Is water wet? Answer and say why.", r"(Yes|No), [a-z ]{1,40}\."),
    ("What is 12 times 13?", r"\d{1,5}"),
    ("Name a fruit.", r"[A-Z][a-z]{2,12}"),
    ("Give an IPv4 address.", r"(\d{1,3}\.){3}\d{1,3}"),
    ("What is the price of a coffee?", r"\$\d{1,3}\.\d{2}"),
    ("Give a US zip code.", r"\d{5}(-\d{4})?"),
    ("Write the hex colour code of red.", r"#[0-9a-fA-F]{6}"),
    ("Name three animals, separated by commas.", r"[a-z]+(, [a-z]+){2}"),
    ("What is the temperature outside, in degrees C?", r"-?\d{1,2}(\.\d)? (C|F)"),
    ("Give a version number of Python.", r"\d{1,2}\.\d{1,2}\.\d{1,2}"),
    ("Write a short sentence about the sun.", r"[A-Z][a-z ,]{5,60}\."),
)
CHOICES = (
    ("Is the sky blue?", ["yes", "no"]),
    ("What colour is grass?", ["red", "green", "blue"]),
    ("Which is a fruit?", ["apple", "carrot", "potato"]),
    ("What is the capital of France?", ["Paris", "London", "Berlin", "Madrid"]),
    ("How many legs does a spider have?", ["four", "fourteen", "eight", "eighteen"]),
    ("Which planet is the largest?", ["Mercury", "Venus", "Earth", "Jupiter"]),
    ("What is the sentiment of 'I love this movie'?", ["positive", "negative", "neutral"]),
    ("What is Python?", ["a programming language", "a snake", "a dance"]),
    ("What day comes after Monday?", ["Sunday", "Tuesday", "Friday"]),
    ("Which animal barks?", ["cat", "dog", "cow"]),
    ("What is 2 + 2?", ["3", "4", "5", "22"]),
    ("Which season is the coldest?", ["spring", "summer", "autumn", "winter"]),
    ("Who wrote Romeo and Juliet?", ["Charles Dickens", "William Shakespeare", "Jane Austen"]),
    ("What colour is the night sky?", ["blue", "dark blue", "black"]),
    ("Is ice hot or cold?", ["hot", "cold"]),
    ("Which of these is an ocean?", ["Pacific", "Sahara", "Everest"]),
)
JSON_TOKENS = 256      # the longest output is under 100 tokens; room for other prompts' runs
SHORT_TOKENS = 48      # regexes and choices
AGREEMENT = 10         # schemas compared with transformers: one of each of the ten shapes
AGREEMENT_TOKENS = 64
MARGIN = 1e-4
NUM_BLOCKS = 1536      # room for the 64 rows as they run (texts() asserts no preemption)


@pytest.fixture(scope="module")
def runner():
    """The engine's worker as served: the batch-invariant mode where the model allows it."""
    return make_runner("smollm2", num_blocks=NUM_BLOCKS, batch_invariant=None)


@pytest.fixture(scope="module")
def tok():
    """transformers' own reading of the GGUF file's tokenizer and chat template."""
    return registry_tokenizer()


def chat(tok, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def json_prompt(tok, i: int, schema: dict) -> list[int]:
    return chat(tok, f"{TASKS[i % len(TASKS)]} Reply with JSON matching this schema: "
                     f"{json.dumps(schema)}", SYSTEM)


def constrained(kind: str, text: str) -> SamplingParams:
    return SamplingParams(constraint=Constraint(kind, text))


def texts(runner, tok, reqs) -> list[tuple[str, str, int]]:
    """reqs run together -> (text without EOS, finish reason, tokens) each."""
    eos = set(runner.info.eos_ids)
    got, eng = run(runner, reqs, num_blocks=NUM_BLOCKS, max_seqs=64)
    assert eng.sched.stats().preemptions == 0
    return [(tok.decode([t for t in ids if t not in eos]), reason, len(ids))
            for ids, reason in got]


@pytest.mark.slow   # 64 rows of the trained model, ~260 steps: 20 s idle, 2 min at load 6
def test_64_schemas_every_output_validates(runner, tok):
    cases = schemas(64)
    reqs = [(json_prompt(tok, i, s), JSON_TOKENS, constrained("json", json.dumps(s)))
            for i, s in enumerate(cases)]
    bad = []
    for i, (s, (text, reason, n)) in enumerate(zip(cases, texts(runner, tok, reqs))):
        try:
            jsonschema.validate(json.loads(text), s)
        except (ValueError, jsonschema.ValidationError) as e:
            bad.append((i, reason, n, text[-80:], str(e)[:120]))
            continue
        if reason != "stop":
            bad.append((i, reason, n, text[-80:], "valid but not stopped"))
    assert not bad, bad


@pytest.mark.slow   # 3 s, but it loads the trained model (10-30 s on the shared 2 cores)
def test_regexes_and_choices_match(runner, tok):
    reqs = ([(chat(tok, q), SHORT_TOKENS, constrained("regex", r)) for q, r in REGEXES]
            + [(chat(tok, f"{q} Answer with one of: {', '.join(c)}."), SHORT_TOKENS,
                constrained("choice", json.dumps(c))) for q, c in CHOICES])
    got = texts(runner, tok, reqs)
    for (q, r), (text, reason, _) in zip(REGEXES, got):
        assert reason == "stop" and re.fullmatch(r, text), (q, r, text, reason)
    for (q, c), (text, reason, _) in zip(CHOICES, got[len(REGEXES):]):
        assert reason == "stop" and text in c, (q, c, text, reason)


class GrammarMask(LogitsProcessor):
    """llguidance's mask for one greedy sequence in transformers' generate: the matcher takes
    the tokens generated since the last call, then every token it forbids becomes -inf."""

    def __init__(self, matcher, prompt_len: int, vocab: int):
        self.matcher, self.prompt_len, self.vocab = matcher, prompt_len, vocab
        self.consumed = 0
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        new = input_ids[0, self.prompt_len + self.consumed:].tolist()
        if new:
            assert self.matcher.consume_tokens(new), self.matcher.get_error()
            self.consumed += len(new)
        return scores.masked_fill(~self.allowed().to(scores.device), float("-inf"))

    def allowed(self) -> torch.Tensor:
        llguidance.torch.fill_next_token_bitmask(self.matcher, self.bitmask)
        bits = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little")
        return torch.from_numpy(bits[:self.vocab].astype(bool))[None]


@pytest.fixture(scope="module")
def stock():
    from tests.gguf_files import registry_model
    return registry_model()


@pytest.mark.slow   # transformers' generate for 10 schemas besides the engine: ~25 s
def test_greedy_under_a_schema_equals_transformers_with_llguidance(runner, tok, stock):
    cases = schemas(64)[:AGREEMENT]
    prompts = [json_prompt(tok, i, s) for i, s in enumerate(cases)]
    got, _ = run(runner, [(p, AGREEMENT_TOKENS, constrained("json", json.dumps(s)))
                          for p, s in zip(prompts, cases)], num_blocks=NUM_BLOCKS)
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=stock.config.vocab_size,
                                         eos_token=tok.eos_token_id)
    partings, stopped = [], 0
    for i, (s, p, (ours, reason)) in enumerate(zip(cases, prompts, got)):
        want = _masked_greedy(stock, lltok, s, p)
        stopped += reason == "stop"
        if ours != want:
            at = next(k for k, (a, b) in enumerate(zip(ours + [-1], want + [-1])) if a != b)
            partings.append((i, at, _masked_margin(stock, lltok, s, p, want[:at])))
    assert stopped >= AGREEMENT // 2   # most end inside the budget: EOS under the mask agrees
    assert all(m < MARGIN for _, _, m in partings) and len(partings) <= 1, (
        f"schema, position, top-2 margin where the engine parts from transformers: {partings}")


def _matcher(lltok, schema: dict):
    # the engine's JSON grammar is compact (docs/structured.md): no free whitespace
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False})
    return llguidance.LLMatcher(lltok, grammar)


def _masked_greedy(model, lltok, schema: dict, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    mask = GrammarMask(_matcher(lltok, schema), len(prompt), model.config.vocab_size)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=AGREEMENT_TOKENS,
                             eos_token_id=model.generation_config.eos_token_id,
                             logits_processor=LogitsProcessorList([mask]))
    return out[0, len(prompt):].tolist()


def _masked_margin(model, lltok, schema: dict, prompt: list[int], done: list[int]) -> float:
    mask = GrammarMask(_matcher(lltok, schema), len(prompt), model.config.vocab_size)
    ids = torch.tensor([prompt + done])
    with torch.inference_mode():
        logits = model(ids).logits[:, -1].float()
    top = torch.topk(mask(ids, logits)[0], 2).values
    return float(top[0] - top[1])
