"""One in-flight request: turns the core's tokens for it into the client's deltas.

A stop string ends a request here, where the text is, but the core may already be a step
further: the frontend then sends the text up to the stop at once, tells the core to finish
the request "stop" after the tokens seen so far (StopRequest), and sends the final delta,
with the core's figures, when the core confirms. Tokens that arrive meanwhile are dropped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.ipc.protocol import AddRequest, Delta
from frontend.detok import Decode, Detokenizer, StreamDetokenizer
from frontend.events import RequestEvents
from frontend.stops import StopMatcher

METRIC_KEYS = ("queue_ms", "ttft_ms", "e2e_ms", "preemptions", "priority", "cached_tokens",
               "log", "log_id", "draft_tokens", "accepted_tokens")


@dataclass
class StepOutcome:
    delta: Delta
    done: bool                    # the request is over for the client
    stop_core: int | None = None  # a stop string ended it: finish it at the core after this many tokens


@dataclass
class RequestState:
    ident: bytes                  # the client's ROUTER identity
    request_id: str
    fid: int                      # its key on the wire to the core
    prompt_ids: list[int]
    decode: Decode
    stop: list[str] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()   # tokens that end it: EOS unless ignore_eos, stop_token_ids
    include_stop: bool = False    # include_stop_str_in_output
    min_tokens: int = 0           # stop strings are looked for only after this many tokens
    max_tokens: int = 0
    replica: int = 0              # the engine replica running it
    add: AddRequest | None = None  # as sent to the core; re-sent if its replica dies
    prompt_logprobs: bool = False  # it asked for them: they go with the first delta
    # its incremental decoder (Tokenizer.detokenizer); None: a Detokenizer over `decode`
    detok: Detokenizer | StreamDetokenizer | None = None
    embed: bool = False           # an embedding: its vector goes with the final delta

    def __post_init__(self):
        self._detok = self.detok or Detokenizer(self.decode, self.prompt_ids)
        self._stops = StopMatcher(self.stop, self.include_stop)
        self._first = True
        self._generated = 0
        self.stopping = False      # waiting for the core to confirm a stop string's finish
        self.skip = 0              # tokens of a re-run the client already has
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        # position 0 has none; the others fill in as the core scores the prompt's chunks
        self._prompt_lp = [None] * len(self.prompt_ids) if self.prompt_logprobs else None
        self._embedding = None     # the core's vector, kept until the finish delta

    @property
    def key(self) -> tuple[bytes, str]:
        return self.ident, self.request_id

    def outstanding(self) -> int:
        """Tokens its replica has yet to process for it (a routing estimate)."""
        return max(0, len(self.prompt_ids) + self.max_tokens - self._generated)

    def rerun(self) -> None:
        """Its replica died: a replica recomputes it from the prompt, and the first tokens
        of that run, identical under greedy or a seed, are the ones the client has."""
        self.skip = self._generated

    def prompt_scores(self, parts: list) -> None:
        """Prompt logprobs from the core ([[first position, entries], ...]): kept by
        position until the first delta takes them (a re-run's repeats overwrite)."""
        if self._prompt_lp is None or not self._first:
            return
        n = len(self._prompt_lp)
        for first, entries in parts:
            for k, e in enumerate(entries):
                if 1 <= first + k < n:
                    self._prompt_lp[first + k] = e

    def embedded(self, vector) -> None:
        """An embed request's vector from the core (a re-run's overwrites)."""
        if self.embed:
            self._embedding = vector

    def skip_rerun(self, ev: RequestEvents) -> RequestEvents:
        n = min(self.skip, len(ev.tokens))
        self.skip -= n
        return RequestEvents(ev.fid, ev.tokens[n:], ev.logprobs[n:], ev.top[n:], ev.reason,
                             ev.figures)

    def step(self, ev: RequestEvents) -> StepOutcome:
        """This step's events for the request (maybe no token) and the core's finish."""
        if self.stopping:
            return StepOutcome(self._delta("", RequestEvents(ev.fid), "stop", ev.figures),
                               done=ev.reason is not None)
        if ev.tokens and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        before = self._generated
        self._generated += len(ev.tokens)
        text = self._text(ev.tokens, ev.reason, before)
        reason, stop_core = ev.reason, None
        if self._stops.matched:
            if reason is None:
                self.stopping, stop_core = True, self._generated
            else:
                reason = "stop"
        return StepOutcome(self._delta(text, ev, reason, ev.figures), reason is not None,
                           stop_core)

    def end(self, reason: str) -> Delta:
        """The final delta of a request ended here (abort): no core figures."""
        return self._delta("", RequestEvents(self.fid), reason, None)

    def _text(self, tokens: list[int], reason: str | None, before: int) -> str:
        final = reason is not None
        text = self._detok.push(self._text_tokens(tokens, reason))
        if final:
            text += self._detok.flush()
        if before + len(tokens) < self.min_tokens:   # as vLLM: no stop strings before min_tokens
            return text
        return self._stops.feed(text, final=final)

    def _text_tokens(self, tokens: list[int], reason: str | None) -> list[int]:
        # The token that ended the request (EOS, a stop_token_id) is reported in token_ids
        # but is not text, unless include_stop_str_in_output.
        if reason == "stop" and tokens and tokens[-1] in self.stop_ids and not self.include_stop:
            return tokens[:-1]
        return tokens

    def _delta(self, text: str, ev: RequestEvents, reason: str | None,
               figures: dict | None) -> Delta:
        prompt = self.prompt_ids if self._first else None
        self._first = False
        d = Delta(self.request_id, text, list(ev.tokens), reason, prompt)
        if prompt is not None and self._prompt_lp is not None:
            d.prompt_logprobs = self._prompt_lp
        if ev.logprobs:
            d.logprobs, d.top_logprobs = ev.logprobs, ev.top
        if reason is not None:
            d.metrics = self._metrics(figures)
            if reason != "abort" and self._embedding is not None:
                d.embedding = self._embedding
        return d

    def _metrics(self, figures: dict | None) -> dict:
        now = time.monotonic()
        first = self.first_token_at
        mine = {"ttft_ms": None if first is None else round((first - self.started) * 1e3, 3),
                "e2e_ms": round((now - self.started) * 1e3, 3)}
        got = {**(figures or {}), **mine}
        return {k: got.get(k) for k in METRIC_KEYS}
