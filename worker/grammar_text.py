"""A Constraint (core/ipc/protocol.py) as llguidance's grammar text, and its check without a
tokenizer (docs/structured.md): what the worker builds its matchers from and what the
frontend checks before a request is admitted. Imports llguidance only (no torch)."""
from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from core.ipc.protocol import Constraint

# Compact JSON: no free whitespace between tokens, so a model cannot pad its output with
# newlines until max_tokens (llguidance's default allows it).
JSON_OPTIONS = {"whitespace_flexible": False}


class BadConstraint(ValueError):
    """The constraint does not compile; the message says why."""


def grammar_of(c: Constraint) -> str:
    """llguidance's grammar for `c`; BadConstraint where its text is not of its kind."""
    if c.kind == "json":
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(c.text, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise BadConstraint(f"not a JSON schema: {e}") from None
    if c.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(c.text)
    if c.kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark(_choice_lark(c.text))
    if c.kind == "grammar":
        try:
            return llguidance.LLMatcher.grammar_from_lark(any_to_lark(c.text))
        except GbnfToLarkError as e:
            raise BadConstraint(f"not a Lark or GBNF grammar: {e}") from None
    raise BadConstraint(f"unknown constraint kind {c.kind!r}")


def _choice_lark(text: str) -> str:
    try:
        options = json.loads(text)
    except ValueError:
        options = None
    if (not isinstance(options, list) or not options
            or not all(isinstance(o, str) and o for o in options)):
        raise BadConstraint("choice must be a non-empty list of non-empty strings")
    return "start: " + " | ".join(json.dumps(o) for o in options)


def check(c: Constraint) -> str:
    """The grammar of `c` once llguidance has checked it (without a tokenizer: what the
    vocabulary cannot express shows only when masks are computed); BadConstraint if not."""
    grammar = grammar_of(c)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise BadConstraint(error.splitlines()[0][:300])
    return grammar
