"""The compile check alone (frontend/compile_check.py, docs/structured.md "The compile
bound"): verdicts kept by key, the bound on a fake clock, and what the byte-vocabulary build
catches that llguidance's validate_grammar lets through."""
from __future__ import annotations

import json

import llguidance
import pytest

from core.ipc.protocol import Constraint
from frontend.compile_check import CompileCheck
from worker.grammar_text import BadConstraint, byte_tokenizer, check, grammar_of

OK = Constraint("json", '{"type":"object","properties":{"a":{"type":"integer"}}}')
BAD = Constraint("regex", "[a-")


def all_of_any_of(k: int, n: int) -> Constraint:
    """allOf over k anyOfs of n objects: llguidance intersects them into n**k alternatives."""
    schema = {"allOf": [{"anyOf": [{"type": "object", "properties": {
        f"a{j}_{i}": {"type": "integer"}}} for i in range(n)]} for j in range(k)]}
    return Constraint("json", json.dumps(schema, separators=(",", ":")))


def new_slow_schema(title: str) -> dict:
    """all_of_any_of(4, 5) as a schema (~0.1-0.5 s to compile) that is new for each `title`
    (the title makes its key)."""
    schema = json.loads(all_of_any_of(4, 5).text)
    schema["title"] = title
    return schema


class Ticks:
    """A clock that advances `step` seconds each time it is read."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_repeated_constraint_is_not_compiled_again():
    cc = CompileCheck()
    assert cc.error(OK) is None and cc.error(OK) is None
    assert cc.compiles == 1
    first = cc.error(BAD)
    assert "does not compile" in first and cc.error(BAD) == first
    assert cc.compiles == 2


def test_the_verdicts_are_the_most_recently_used():
    cc = CompileCheck(size=2)
    regexes = [Constraint("regex", f"a{i}") for i in range(3)]
    for c in regexes[:2] + regexes[:1] + regexes[2:]:   # a0 used again: a1 is dropped
        cc.error(c)
    assert cc.compiles == 3
    cc.error(regexes[0])
    assert cc.compiles == 3
    cc.error(regexes[1])
    assert cc.compiles == 4


def test_a_compile_past_the_bound_is_refused_and_remembered():
    cc = CompileCheck(bound_ms=100, clock=Ticks(0.25))   # every compile "takes" 250 ms
    error = cc.error(OK)
    assert "took 250 ms" in error and "bound of 100 ms" in error
    assert "--max-compile-ms" in error
    assert cc.error(OK) == error and cc.compiles == 1
    assert CompileCheck(bound_ms=300, clock=Ticks(0.25)).error(OK) is None


def test_the_byte_build_catches_what_validate_lets_through():
    """llguidance's validate_grammar passes this schema; building its parser (as every worker
    would, in a step) fails on its symbol count. The check refuses it before admission."""
    c = all_of_any_of(3, 16)
    assert llguidance.LLMatcher.validate_grammar(grammar_of(c)) == ""
    with pytest.raises(BadConstraint):
        check(c, byte_tokenizer())


@pytest.mark.parametrize("grammar", ['start: "a" <|im_end|>', 'start: "a" <[300]>'])
def test_what_names_the_vocabulary_is_left_to_the_worker(grammar):
    assert check(Constraint("grammar", grammar), byte_tokenizer())
