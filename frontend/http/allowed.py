"""Which body fields each endpoint knows: an unknown (or misspelled) field is a 400 naming
it, as OpenAI answers unrecognized arguments.

Fields OpenAI defines that this server cannot honour are accepted only at a neutral value
(null, the default, an empty list or object: a value that asks for nothing), and any other
value is a 400 saying they are not supported. The rest is honoured by schema.py (the tool
fields by tools.py).
"""
from __future__ import annotations

import json
from collections.abc import Callable

from frontend.http.errors import ApiError
from frontend.http.chat_options import FIELDS as CHAT_OPTIONS
from frontend.http.guided import ALIASES

# OpenAI's fields both endpoints honour, then vLLM's extras this server honours.
_COMMON = {"model", "n", "stream", "stream_options", "temperature", "top_p", "seed", "stop",
           "max_tokens", "presence_penalty", "frequency_penalty", "user", "logit_bias",
           "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
           "include_stop_str_in_output", "skip_special_tokens", "ignore_eos",
           "add_special_tokens", "priority", "response_format", "structured_outputs",
           "cache_salt", "speculative", *ALIASES}
COMPLETION = frozenset(_COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix",
                                  "prompt_logprobs"})
CHAT = frozenset(_COMMON | {"prompt_logprobs", *CHAT_OPTIONS,
    "messages", "logprobs", "top_logprobs", "max_completion_tokens", "tools", "functions",
    "tool_choice", "function_call", "parallel_tool_calls", "audio",
    "modalities", "prediction", "store", "metadata", "service_tier", "reasoning_effort",
    "web_search_options", "verbosity", "moderation", "prompt_cache_key",
    "prompt_cache_retention", "prompt_cache_options", "safety_identifier"})


def _one_of(*values) -> Callable[[object], bool]:
    # type too: 1 == True and 0 == False in Python, not in JSON
    return lambda v: any(v == x and type(v) is type(x) for x in values)


def _is_str(v) -> bool:
    return isinstance(v, str)


# name -> (its neutral values, as the 400 says them; the test of a non-null value).
# Cache and safety hints change no output: any string passes.
NEUTRAL: dict[str, tuple[str, Callable[[object], bool]]] = {
    "best_of": ("null or 1", _one_of(1)),
    "logit_bias": ("null or {}", _one_of({})),
    "suffix": ('null or ""', _one_of("")),
    "functions": ("null or []", _one_of([])),
    "function_call": ('null or "none"', _one_of("none")),
    "audio": ("null", _one_of()),
    "modalities": ('null or ["text"]', _one_of(["text"])),
    "prediction": ("null", _one_of()),
    "store": ("null or false", _one_of(False)),
    "metadata": ("null or {}", _one_of({})),
    "service_tier": ('null, "auto" or "default"', _one_of("auto", "default")),
    "reasoning_effort": ("null", _one_of()),
    "web_search_options": ("null", _one_of()),
    "verbosity": ('null or "medium"', _one_of("medium")),
    "moderation": ("null", _one_of()),
    "prompt_cache_key": ("null or a string (a hint; ignored)", _is_str),
    "prompt_cache_retention": ('null or "in_memory"', _one_of("in_memory")),
    "prompt_cache_options": ("null", _one_of()),
    "safety_identifier": ("null or a string (ignored)", _is_str),
}


def check_known(body: dict, known: frozenset[str]) -> None:
    """Raises ApiError for the first unknown field, then for a non-neutral value of a field
    that is accepted only at its neutral value."""
    for name in body:
        if name not in known:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", name)
    for name, (neutral, ok) in NEUTRAL.items():
        value = body.get(name)
        if value is not None and name in known and not ok(value):
            raise ApiError(400, f"{name} is not supported by this server: it is accepted "
                                f"only as {neutral}, got {json.dumps(value)[:80]}",
                           name)
