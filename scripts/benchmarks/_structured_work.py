"""scripts/bench structured's workload: the committed chat questions, each asking for one
JSON object under its own schema (`_schemas.py`), as token ids through the model's chat
template; the constrained and the unconstrained requests made of them; the calibration that
gives both the same lengths; and whether the constrained outputs hold to their schemas."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scripts.benchmarks import common as bl
from scripts.benchmarks._schemas import schemas

PROMPTS = Path(__file__).parent / "data" / "chat_prompts.json"
ASK = "{question}\nAnswer with one JSON object, and nothing else, under this JSON schema:\n{schema}"
# A schema outside the workload's: the warm-up's, which makes the worker's llguidance
# tokenizer (seconds, once per worker) before anything is measured.
WARM_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@dataclass(frozen=True)
class Item:
    prompt: list[int]
    schema: dict


@dataclass(frozen=True)
class Workload:
    items: list[Item]
    tokenizer: object          # the model's HF tokenizer: to read the outputs back


def workload(model: str, n: int) -> Workload:
    """n items: question i (cycling through the committed 64) with schema i written into
    the user's message, rendered as the gateway renders a chat."""
    from frontend.http.chat import ChatTemplate
    from worker.load import resolve_checkpoint
    tmpl = ChatTemplate.load(str(resolve_checkpoint(model)[0]))
    questions = json.loads(PROMPTS.read_text())
    items = []
    for i, schema in enumerate(schemas(n)):
        text = ASK.format(question=questions[i % len(questions)], schema=json.dumps(schema))
        ids = tmpl.tokenizer(tmpl.render([{"role": "user", "content": text}]),
                             add_special_tokens=False)["input_ids"]
        items.append(Item(ids, schema))
    return Workload(items, tmpl.tokenizer)


def tagged(schema: dict, tag: str) -> dict:
    """`schema` under a title of its own: the same language, a text (so a key) the engine
    has not seen, so that every measured request's grammar is built anew in the worker, as
    where each request brings its own schema."""
    return {"title": tag, **schema}


def requests(w: Workload, lengths: list[int], constrained: bool, tag: str) -> list[bl.Req]:
    """One request per item, max_tokens from `lengths`; the constrained ones under their
    schema titled `tag`-i."""
    return [bl.Req(it.prompt, n, options={"structured_outputs": {
                "json": tagged(it.schema, f"{tag}-{i}")}} if constrained else {})
            for i, (it, n) in enumerate(zip(w.items, lengths))]


def warmup(w: Workload) -> list[bl.Req]:
    """Short requests, free and constrained, whose prompts are no prefix of the workload's."""
    heads = [it.prompt[:32][::-1] for it in w.items[:2]]
    return ([bl.Req(p, 4) for p in heads]
            + [bl.Req(p, 4, options={"structured_outputs": {"json": WARM_SCHEMA}})
               for p in heads])


def calibration(w: Workload, run: bl.RunResult, cap: int) -> tuple[list[int], dict]:
    """Each request's length in the constrained run without ignore_eos (its JSON to its end,
    or `cap`): the max_tokens both sides then run to. And how the outputs held: finished by
    the grammar's end, valid JSON under their schema."""
    import jsonschema
    lengths, stopped, valid = [], 0, 0
    for it, t in zip(w.items, run.traces):
        lengths.append(max(1, min(cap, len(t.tokens))))
        stopped += t.finish_reason == "stop"
        try:
            jsonschema.validate(json.loads(w.tokenizer.decode(t.tokens,
                                                              skip_special_tokens=True)),
                                it.schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return lengths, {"requests": len(run.traces), "errors": sum(t.error is not None
                                                                  for t in run.traces),
                     "finished_stop": stopped, "valid_json": valid,
                     "output_tokens": sum(lengths)}
