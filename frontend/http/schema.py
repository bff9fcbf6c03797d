"""The gateway's request bodies: OpenAI's JSON in, one GenRequest (the Client's Generate,
how many choices, how to answer) out, or an ApiError.

Every field is known (allowed.py: an unknown one is a 400 naming it), typed (fields.py)
and range-checked with the frontend's own checks (frontend/validate.py): the same bounds
and messages, with max_tokens up to the served max_model_len; what only the model knows
(top_k against its vocabulary, the prompt's tokens) the frontend checks, and its 400
passes through as it is. The body's JSON itself is checked first (jsonbody.py).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from core.ipc.protocol import Generate
from frontend.client.common import make_generate
from frontend.compile_check import CompileCheck
from frontend.http import fields, guided
from frontend.http.allowed import CHAT, COMPLETION, check_known
from frontend.http.chat import ChatTemplate
from frontend.http.chat_options import chat_options
from frontend.http.chat_special import ChatPrompt
from frontend.http.errors import ApiError
from frontend.http.fields import BOOL, IDS, INT, NUM, OBJ, STR, get
from frontend.http.prompt_logprob_fields import (PromptAsk, chat_ask, completion_ask,
                                           engine_max_tokens)
from frontend.http.reply_bound import check_reply
from frontend.http.tools import ToolAsk, tool_ask
from core.bounds import MAX_LOGPROBS, MAX_PRIORITY, SEED_LIMIT
from frontend.structured import constraint_of
from frontend.validate import InvalidField, check_fields

__all__ = ["ApiError", "GenRequest", "parse_chat", "parse_completion", "parse_priority"]

PRIORITY_HEADER = "X-TL-Priority"
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 16
MAX_PROMPTS = 256    # prompts in one /v1/completions body
MAX_CHOICES = 256    # engine requests one body makes: prompts x n
# booleans; no obfuscation is sent; continuous_usage_stats is vLLM's (usage on every chunk)
STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")
_INT = re.compile(r"[+-]?[0-9]{1,7}")


@dataclass
class GenRequest:
    """A parsed body: the engine's request as the Client builds it (make_generate, so the
    same Generate and the same request_id default) and how the gateway answers it."""
    msg: Generate
    stream: bool = False
    n: int = 1
    include_usage: bool = False   # stream_options.include_usage
    echo: bool = False
    prompts: list | None = None   # a batch's prompts (None: msg.prompt alone)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats
    max_tokens_field: str = "max_tokens"  # the body's name for it (chat: either name)
    structured_field: str = "structured_outputs"  # or the older alias it came as (guided.py)
    prompt_ask: PromptAsk = PromptAsk()   # prompt logprobs (prompt_logprob_fields.py)
    tools: ToolAsk | None = None          # the offered tools (tools.py)
    # a chat whose user strings spell special tokens: msg.prompt must become its ids
    # (ChatTemplate.ids, off the loop) before it is sent
    forged: ChatPrompt | None = None
    renames: dict | None = None   # a field's name in this body, where not chat's (responses)

    @property
    def batch(self) -> list:
        return self.prompts or [self.msg.prompt]

    @property
    def choices(self) -> int:
        """Engine requests: n per prompt; choice i is prompt i // n's sample i % n."""
        return len(self.batch) * self.n

    def param(self, field: str | None) -> str | None:
        """The body field a Generate field (an InvalidField's, an engine 400's) came from."""
        name = {"max_tokens": self.max_tokens_field,
                "structured_outputs": self.structured_field}.get(field, field)
        return (self.renames or {}).get(name, name)

    def client_kwargs(self, i: int = 0) -> dict:
        """Choice i's request as the arguments of AsyncClient.stream (make_generate's
        parameters are Generate's fields). With several choices its request_id is
        `<id>-<i>`; with n > 1 a given seed is seed + (i % n), so that seeded samples of a
        prompt differ and stay reproducible, and a prompt's samples do not depend on its
        place in the batch."""
        p, j = divmod(i, self.n)
        kw = asdict(self.msg)
        del kw["wire"], kw["key_proof"]   # the client's to set, not the caller's
        del kw["embed"]                   # a generation (embeddings.py asks for embed_stream)
        kw["prompt"] = self.batch[p]
        if self.choices > 1:
            kw["request_id"] = f"{self.msg.request_id}-{i}"
        if j and kw["seed"] is not None:
            kw["seed"] = (kw["seed"] + j) % SEED_LIMIT
        return kw


def parse_priority(value: str | None) -> int | None:
    """The X-TL-Priority header (None when absent: the body's `priority` then counts)."""
    if value is None:
        return None
    lo, hi = -MAX_PRIORITY, MAX_PRIORITY
    text = value.strip()
    if not _INT.fullmatch(text) or not lo <= int(text) <= hi:
        raise ApiError(400, f"{PRIORITY_HEADER} must be an integer in [{lo}, {hi}], "
                            f"got {value!r}", PRIORITY_HEADER)
    return int(text)


def parse_completion(body: dict, priority: int | None,
                     max_model_len: int | None = None) -> GenRequest:
    check_known(body, COMPLETION)
    logprobs = get(body, "logprobs", INT)
    echo = get(body, "echo", BOOL, False)
    ask = completion_ask(body, echo, logprobs)
    prompts = _prompts(body)
    given = get(body, "max_tokens", INT)
    max_tokens = COMPLETION_MAX_TOKENS if given is None else given
    # max_tokens 0 (echo) always fits: the engine's one token for it is dropped, and the
    # frontend's prompt check (fewer than max_model_len tokens) leaves room for it
    msg = _generate(body, prompts[0], priority, engine_max_tokens(ask, max_tokens), logprobs,
                    add_special_tokens=True, prompt_logprobs=ask.engine,
                    explicit=given is not None and not ask.prompt_only)
    gen = _batch(_request(body, msg, max_model_len, echo, ask=ask), prompts)
    return check_reply(gen, "logprobs", max_model_len)


def _prompts(body: dict) -> list:
    prompts = fields.prompts(body.get("prompt"))
    if len(prompts) > MAX_PROMPTS:
        raise ApiError(400, f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS} "
                            "in one request", "prompt")
    return prompts


def _batch(gen: GenRequest, prompts: list) -> GenRequest:
    gen.prompts = prompts
    if gen.choices > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts x n={gen.n} is {gen.choices} choices; "
                            f"at most {MAX_CHOICES} in one request", "n")
    return gen


def parse_chat(body: dict, priority: int | None, chat: ChatTemplate,
               default_max_tokens: int, max_model_len: int | None = None,
               compiles: CompileCheck | None = None) -> GenRequest:
    """`chat` turns the checked messages (and tools) into the prompt text, which holds its
    own special tokens: add_special_tokens defaults to false. Where a user string spelled a
    special token, `forged` holds the prompt to tokenize (chat_special.py). `compiles`
    compiles the tools' schemas and grammar (a fresh CompileCheck where not given)."""
    check_known(body, CHAT)
    ask = chat_ask(body)
    compiles = compiles or CompileCheck()
    tools = tool_ask(body, compiles)
    max_tokens = _chat_max_tokens(body)
    messages = fields.messages(body.get("messages"))
    prompt = chat.prompt(messages, chat_options(body, messages),
                         tools=tools.tools if tools else None)
    msg = _generate(body, prompt.text, priority,
                    default_max_tokens if max_tokens is None else max_tokens,
                    _chat_logprobs(body), add_special_tokens=False,
                    explicit=max_tokens is not None, prompt_logprobs=ask.engine)
    if tools is not None and tools.constrains:
        msg = _tool_constraint(msg, tools, chat.tool_format, compiles)
    newer = body.get("max_completion_tokens") is not None
    gen = _request(body, msg, max_model_len, ask=ask,
                   max_tokens_field="max_completion_tokens" if newer else "max_tokens")
    gen.tools, gen.forged = tools, prompt if prompt.forged else None
    return check_reply(gen, "top_logprobs" if body.get("top_logprobs") is not None
                       else "logprobs", max_model_len)


def _tool_constraint(msg: Generate, tools: ToolAsk, fmt: str,
                     compiles: CompileCheck) -> Generate:
    """`required` or a named function: the reply is constrained to calls, so it cannot be
    constrained otherwise as well."""
    try:
        other = constraint_of(msg.response_format, msg.structured_outputs)
    except InvalidField:
        return msg   # a malformed field: _request names it
    if other is not None:
        raise ApiError(400, f"tool_choice {tools.choice!r} constrains the reply to tool "
                            "calls: give no response_format or structured_outputs with it",
                       "tool_choice")
    return replace(msg, response_format=None,
                   structured_outputs=tools.structured_outputs(fmt, compiles, msg.max_tokens))


def _chat_max_tokens(body: dict) -> int | None:
    newer = get(body, "max_completion_tokens", INT)
    older = get(body, "max_tokens", INT)
    if None not in (newer, older) and newer != older:
        raise ApiError(400, f"max_completion_tokens ({newer}) and max_tokens ({older}) "
                            "differ; give one", "max_completion_tokens")
    return older if newer is None else newer


def _chat_logprobs(body: dict) -> int | None:
    """The ZMQ logprobs (alternatives per token) of chat's logprobs + top_logprobs."""
    wanted = get(body, "logprobs", BOOL, False)
    top = get(body, "top_logprobs", INT)
    if top is not None and not wanted:
        raise ApiError(400, "top_logprobs requires logprobs: true", "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}",
                       "top_logprobs")
    return (top or 0) if wanted else None


def _generate(body: dict, prompt, priority: int | None, max_tokens: int,
              logprobs: int | None, add_special_tokens: bool, explicit: bool,
              prompt_logprobs: int | None = None) -> Generate:
    """`explicit`: the body gave max_tokens, so prompt + max_tokens must fit the context
    (a 400 otherwise, as OpenAI and vLLM answer); a default one is cut at the context.
    Every field given: OpenAI's defaults (temperature 1.0) are not the Client's."""
    own = get(body, "priority", INT, 0)
    if not -MAX_PRIORITY <= own <= MAX_PRIORITY:   # checked where the header overrides it too
        raise ApiError(400, f"priority must be in [{-MAX_PRIORITY}, {MAX_PRIORITY}], got {own}",
                       "priority")
    return make_generate(
        prompt, max_tokens=max_tokens, priority=own if priority is None else priority,
        temperature=float(get(body, "temperature", NUM, 1.0)),
        top_p=float(get(body, "top_p", NUM, 1.0)),
        top_k=_top_k(body), seed=get(body, "seed", INT), stop=fields.stop(body.get("stop")),
        ignore_eos=get(body, "ignore_eos", BOOL, False), logprobs=logprobs,
        min_p=float(get(body, "min_p", NUM, 0.0)),
        presence_penalty=float(get(body, "presence_penalty", NUM, 0.0)),
        frequency_penalty=float(get(body, "frequency_penalty", NUM, 0.0)),
        repetition_penalty=float(get(body, "repetition_penalty", NUM, 1.0)),
        min_tokens=get(body, "min_tokens", INT, 0),
        stop_token_ids=get(body, "stop_token_ids", IDS),
        include_stop_str_in_output=get(body, "include_stop_str_in_output", BOOL, False),
        skip_special_tokens=get(body, "skip_special_tokens", BOOL, True),
        add_special_tokens=get(body, "add_special_tokens", BOOL, add_special_tokens),
        user=get(body, "user", STR), max_tokens_must_fit=explicit,
        prompt_logprobs=prompt_logprobs, response_format=body.get("response_format"),
        structured_outputs=guided.structured_outputs(body)[0],
        cache_salt=get(body, "cache_salt", STR),
        speculative=get(body, "speculative", BOOL, True))


def _top_k(body: dict) -> int:
    k = get(body, "top_k", INT, 0)
    return 0 if k == -1 else k  # vLLM's "off" is -1, the engine's 0


def _request(body: dict, msg: Generate, max_model_len: int | None,
             echo: bool = False, ask: PromptAsk = PromptAsk(),
             max_tokens_field: str = "max_tokens") -> GenRequest:
    get(body, "model", STR)
    n = get(body, "n", INT, 1)
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be in [1, {MAX_N}], got {n}", "n")
    stream = get(body, "stream", BOOL, False)
    usage, continuous = _stream_options(body, stream)
    gen = GenRequest(msg, stream, n, usage, echo, continuous_usage=continuous,
                     max_tokens_field=max_tokens_field, prompt_ask=ask,
                     structured_field=guided.structured_outputs(body)[1])
    try:
        check_fields(gen.msg, max_model_len)
        # its shape and size; the frontend compiles it, off its loop (docs/structured.md)
        constraint_of(gen.msg.response_format, gen.msg.structured_outputs)
    except InvalidField as e:
        raise ApiError(400, str(e), gen.param(e.field)) from None
    return gen


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats)."""
    options = get(body, "stream_options", OBJ)
    if options is None:
        return False, False
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true",
                       "stream_options")
    for key, value in options.items():
        if key not in STREAM_OPTIONS or not isinstance(value, (bool, type(None))):
            raise ApiError(400, f"stream_options: {key[:40]!r} is not one of "
                                f"{', '.join(STREAM_OPTIONS)} with a boolean value",
                           "stream_options")
    return options.get("include_usage") is True, options.get("continuous_usage_stats") is True
