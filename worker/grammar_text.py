"""A Constraint (core/ipc/protocol.py) as llguidance's grammar text, and its check over a
vocabulary of bytes (docs/structured.md): what the worker builds its matchers from and what
the frontend checks before a request is admitted. Imports llguidance only (no torch)."""
from __future__ import annotations

import json

import llguidance
from llguidance._tokenizer import TokenizerWrapper
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from core.ipc.protocol import Constraint

# Compact JSON: no free whitespace between tokens, so a model cannot pad its output with
# newlines until max_tokens (llguidance's default allows it).
JSON_OPTIONS = {"whitespace_flexible": False}
# Errors that name the served vocabulary (a special token, a token id): a vocabulary of bytes
# cannot judge them, so such a grammar is checked without one and the worker decides.
VOCABULARY_ERRORS = ("unknown special token", "Token range end too large")


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


def byte_tokenizer():
    """llguidance's tokenizer over the 256 bytes and an EOS: a model-free vocabulary (a few
    milliseconds to make) that any text can be spelled in."""
    return llguidance.LLTokenizer(TokenizerWrapper(_Bytes()))


class _Bytes:
    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s if isinstance(s, bytes) else s.encode())


def check(c: Constraint, tokenizer) -> str:
    """The grammar of `c` once llguidance has built its whole matcher over `tokenizer`
    (byte_tokenizer()): the same parser build the worker does, so what the worker would fail
    to build (llguidance's symbol count, its initial lexer's size; neither is seen by
    LLMatcher.validate_grammar) fails here; BadConstraint if it does."""
    grammar = grammar_of(c)
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    error = m.get_error() if m.is_error() else ""
    if error.startswith("at ") and any(v in error for v in VOCABULARY_ERRORS):
        error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise BadConstraint(error.splitlines()[0][:300])
    return grammar
