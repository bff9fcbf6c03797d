"""The served model's name: the card /v1/models and /v1/models/{id} answer, and which
`model` a request must name.

By default (no --served-model-name) the name is the engine's (serve's --model) and a body's
`model` may be any string: one model is served, and clients written for OpenAI send
theirs. With --served-model-name the name is the operator's (a Hub id, so that guidellm and
lm-eval find a tokenizer under it) and a body naming another model is OpenAI's 404
`model_not_found`, as vLLM answers it.
"""
from __future__ import annotations

from dataclasses import dataclass

from frontend.http.errors import ApiError


@dataclass(frozen=True)
class ServedModel:
    name: str              # what /v1/models lists and replies carry
    created: int           # the card's `created` (the gateway's start, Unix seconds)
    max_model_len: int
    strict: bool = False   # the operator named it: requests must use this name

    def card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "tl-engine", "max_model_len": self.max_model_len}

    def listing(self) -> dict:
        return {"object": "list", "data": [self.card()]}

    def card_of(self, model_id: str) -> dict:
        """GET /v1/models/{id}: the card, or OpenAI's 404 for another id."""
        if model_id != self.name:
            raise not_found(model_id)
        return self.card()

    def check(self, body: dict) -> None:
        """A body naming another model, when the name is the operator's: 404. A `model`
        that is not a string is left to the body's own checks (a 400 naming it)."""
        asked = body.get("model")
        if self.strict and isinstance(asked, str) and asked != self.name:
            raise not_found(asked)


def not_found(model_id: str) -> ApiError:
    return ApiError(404, f"The model `{model_id[:200]}` does not exist.", "model",
                    "model_not_found")
