"""vLLM's older structured-output fields (`guided_json`, `guided_choice`, `guided_regex`,
`guided_grammar`) read as aliases of `structured_outputs` (docs/structured.md, "The fields").

vLLM replaced them with `structured_outputs` ({"json": ...} and so on); clients written for
its earlier releases (lm-eval's, guidellm's, many notebooks) still send them. Each alias is
the same constraint as the new field's key of the same kind, so every check downstream
(shape, size, compile) is the new field's; its 400s name the alias the body gave.
"""
from __future__ import annotations

from frontend.http.errors import ApiError

# the alias -> structured_outputs' key it stands for
ALIASES = {"guided_json": "json", "guided_choice": "choice", "guided_regex": "regex",
           "guided_grammar": "grammar"}
NEW_FIELD = "structured_outputs"


def given_aliases(body: dict) -> list[str]:
    """The aliases the body sets (null counts as not given)."""
    return [name for name in ALIASES if body.get(name) is not None]


def structured_outputs(body: dict) -> tuple[dict | None, str]:
    """(the body's structured_outputs, the field that carried it). An alias and the new
    field together, or two aliases, is a 400 naming them: which one the client meant is
    not ours to guess."""
    aliases = given_aliases(body)
    new = body.get(NEW_FIELD)
    if aliases and new is not None:
        raise ApiError(400, f"give {NEW_FIELD} or {aliases[0]} (its older vLLM name), not "
                            "both", aliases[0])
    if len(aliases) > 1:
        raise ApiError(400, f"give one of {', '.join(aliases)}: each is a whole constraint",
                       aliases[1])
    if not aliases:
        return new, NEW_FIELD
    name = aliases[0]
    return {ALIASES[name]: body[name]}, name
