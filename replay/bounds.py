"""A step log's values against the bounds the engine applies to them: the KV layout's
(core/config.py), a request's fields as the frontend checks them (frontend/validate.py over
core/bounds.py), and the model's vocabulary and context from the log's own meta. A value
no engine could have logged is damage (exit 2), never a crash or a divergence further on."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

from core.config import layout_problem
from core.bounds import INT32_MAX
from core.ipc.protocol import SamplingParams
from frontend.validate import InvalidField, check_fields
from replay.damage import DamagedLog, int_list, integer

_DEFAULTS = asdict(SamplingParams())


@dataclass(frozen=True)
class Bounds:
    vocab_size: int      # a token is in [0, vocab_size)
    max_model_len: int   # the scheduler's: positions and a request's max_tokens stay below it
    num_blocks: int      # the pool's: a step's free blocks are at most these

    def tokens(self, v, where: str) -> list[int]:
        return int_list(v, where, 0, self.vocab_size - 1)

    def position(self, v: int, where: str) -> int:
        return integer(v, where, 0, self.max_model_len)


def meta_bounds(meta: dict) -> Bounds:
    """The meta's layout and model limits checked (their types already are)."""
    info, sc = meta["model_info"], meta["sched_config"]
    vocab = integer(info["vocab_size"], "meta model_info vocab_size", 1, INT32_MAX)
    problem = layout_problem(meta["num_blocks"], meta["block_size"], info["max_model_len"])
    if problem:
        raise DamagedLog(f"meta: {problem}")
    integer(sc["max_model_len"], "meta sched_config max_model_len", 1, info["max_model_len"])
    b = Bounds(vocab, sc["max_model_len"], meta["num_blocks"])
    b.tokens(info["eos_ids"], "meta model_info eos_ids")
    return b


def check_request(r: dict, b: Bounds, where: str) -> None:
    """A logged request's fields as the frontend checked them when it came in; a failure
    names its column (a sampling field names `sampling` and the field)."""
    s = {k: v for k, v in r["sampling"].items() if k not in ("ignore_eos", "embed")}
    req = SimpleNamespace(**{**_DEFAULTS, **s}, max_tokens=r["max_tokens"], stop=None,
                          priority=r["priority"], user=r.get("user"),
                          key_hash=r.get("key_hash"))
    try:
        check_fields(req, b.max_model_len, b.vocab_size)
    except InvalidField as e:
        column = "sampling" if e.field in _DEFAULTS else e.field
        raise DamagedLog(f"{where} {column}: {e}") from None
