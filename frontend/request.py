"""One in-flight request: turns the core's tokens for it into the client's deltas."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.ipc.protocol import Delta
from frontend.detok import Decode, Detokenizer
from frontend.stops import StopMatcher


@dataclass
class StepOutcome:
    delta: Delta
    done: bool            # the request is over for the client
    abort_core: bool      # the core still runs it (a stop string ended it): abort there


@dataclass
class RequestState:
    ident: bytes          # the client's ROUTER identity
    request_id: str
    fid: int              # its key on the wire to the core
    prompt_ids: list[int]
    decode: Decode
    stop: list[str] = field(default_factory=list)
    eos_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False

    def __post_init__(self):
        self._detok = Detokenizer(self.decode, self.prompt_ids)
        self._stops = StopMatcher(self.stop)
        self._first = True

    @property
    def key(self) -> tuple[bytes, str]:
        return self.ident, self.request_id

    def step(self, tokens: list[int], reason: str | None) -> StepOutcome:
        """This step's tokens (maybe none) and the core's finish reason (None: runs on)."""
        text = self._detok.push(self._text_tokens(tokens, reason))
        if reason is not None:
            text += self._detok.flush()
        out = self._stops.feed(text, final=reason is not None)
        abort_core = False
        if self._stops.matched:
            abort_core, reason = reason is None, "stop"
        return StepOutcome(self._delta(out, tokens, reason), reason is not None, abort_core)

    def _text_tokens(self, tokens: list[int], reason: str | None) -> list[int]:
        # The EOS that ended the request is reported in token_ids but is not text.
        if (reason == "stop" and not self.ignore_eos and tokens
                and tokens[-1] in self.eos_ids):
            return tokens[:-1]
        return tokens

    def _delta(self, text: str, tokens: list[int], reason: str | None) -> Delta:
        prompt = self.prompt_ids if self._first else None
        self._first = False
        return Delta(self.request_id, text, list(tokens), reason, prompt)
