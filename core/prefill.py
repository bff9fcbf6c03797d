"""How prompts are cut into chunks: the scheduler's second seam (seed sections 2.6, L10.3)."""
from __future__ import annotations

from typing import Protocol


class PrefillPolicy(Protocol):
    def chunk_len(self, remaining: int, budget: int, alone: bool) -> int:
        """Positions to prefill now out of `remaining`, given `budget` tokens left in the
        step; `alone` when nothing else is scheduled yet. 0 means: not this step."""
        ...


class WholePrompt:
    """The whole rest at once: when it fits the budget, or when the step is empty (a prompt
    longer than the budget then runs alone rather than never)."""

    __slots__ = ()

    def chunk_len(self, remaining: int, budget: int, alone: bool) -> int:
        return remaining if remaining <= budget or alone else 0

    def __repr__(self) -> str:
        return "WholePrompt()"


class Chunked:
    """At most `max_chunk` positions per step and never more than the budget, so a long
    prompt spans several steps while decodes keep running."""

    __slots__ = ("max_chunk",)

    def __init__(self, max_chunk: int):
        if type(max_chunk) is not int or max_chunk < 1:
            raise ValueError(f"max_chunk must be a positive int, got {max_chunk!r}")
        self.max_chunk = max_chunk

    def chunk_len(self, remaining: int, budget: int, alone: bool) -> int:
        return min(remaining, budget, self.max_chunk)

    def __repr__(self) -> str:
        return f"Chunked({self.max_chunk})"
