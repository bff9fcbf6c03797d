"""The core never dies of a request's values: range checks at admission, and a step that
cannot be built fails only the requests in it (no worker needed: the step is abandoned
before it would be sent)."""
from __future__ import annotations

import pytest
import zmq

import core.engine
from core.config import CoreConfig
from core.process import CoreLoop
from core.ipc.protocol import AddRequest, I32, ModelInfo, SamplingParams
from core.sched import InvalidRequest, Request

INFO = ModelInfo("m", num_blocks=64, block_size=16, max_model_len=128, vocab_size=300,
                 eos_ids=[256])


@pytest.mark.parametrize("field, value", [
    ("top_k", 2 ** 31), ("top_k", -1), ("seed", 2 ** 63), ("seed", -1),
    ("temperature", float("inf")), ("temperature", float("nan")), ("top_p", 0.0),
    ("max_tokens", 2 ** 63), ("max_tokens", 2 ** 64)])
def test_out_of_range_values_are_refused_at_admission(field, value):
    engine = CoreConfig("-", "-", "-", "-").make_engine(INFO)
    sampling = SamplingParams(**{field: value}) if field != "max_tokens" else SamplingParams()
    req = Request([1, 2, 3], value if field == "max_tokens" else 4)
    with pytest.raises(InvalidRequest, match=field):
        engine.add(req, sampling)
    assert engine.add(Request([1, 2, 3], 4)) == 0   # a refused add consumed no id


@pytest.fixture
def loop(tmp_path):
    ctx = zmq.Context()
    ep = {k: f"ipc://{tmp_path}/{k}" for k in ("fi", "fo", "wi", "wo")}
    lp = CoreLoop(CoreConfig(ep["fi"], ep["fo"], ep["wi"], ep["wo"]), ctx)
    lp.info = INFO
    lp.engine = lp.cfg.make_engine(INFO)
    try:
        yield lp
    finally:
        lp.close()
        ctx.term()


def add(loop: CoreLoop, fid: int, prompt: list[int]) -> None:
    loop.add(AddRequest(fid, f"r{fid}", I32(prompt), 8, 0, SamplingParams()))


def test_a_step_that_cannot_be_built_fails_only_its_requests(loop, monkeypatch):
    add(loop, 0, [1, 2, 3])
    real = core.engine.build_batch

    def poisoned(step, out, *args):
        if any(c.id == 0 for c in out.prefill) or 0 in out.decode:
            raise OverflowError("int too large to convert")
        return real(step, out, *args)
    monkeypatch.setattr(core.engine, "build_batch", poisoned)
    loop.step()
    assert not loop.engine.sched.has_unfinished() and loop.seq_of == {}
    add(loop, 1, [4, 5, 6])          # the engine serves on
    batch = loop.engine.plan()
    assert list(batch.seq_ids) == [1]


def test_an_abandoned_chunk_is_never_served_from_the_prefix_cache(tmp_path, monkeypatch):
    """A failed step advanced its non-last chunk without writing K/V: the cache forgets it."""
    ctx = zmq.Context()
    ep = {k: f"ipc://{tmp_path}/{k}" for k in ("fi", "fo", "wi", "wo")}
    lp = CoreLoop(CoreConfig(ep["fi"], ep["fo"], ep["wi"], ep["wo"], max_chunk=32), ctx)
    lp.info, lp.engine = INFO, lp.cfg.make_engine(INFO)
    try:
        add(lp, 0, list(range(1, 80)))
        monkeypatch.setattr(core.engine, "build_batch", _poison)
        lp.step()
        assert lp.engine.sched.blocks.cached_blocks() == 0 and lp.seq_of == {}
        monkeypatch.undo()
        add(lp, 1, list(range(1, 80)))
        assert lp.engine.plan().positions[0] == 0   # no hit on the unwritten blocks
    finally:
        lp.close()
        ctx.term()


def _poison(*args):
    raise OverflowError("int too large to convert")


def test_a_refusal_names_the_field_at_fault(tmp_path, monkeypatch):
    """Rejected.param: a request that cannot fit the KV pool blames max_tokens, unless the
    prompt with one generated token cannot fit either."""
    ctx = zmq.Context()
    ep = {k: f"ipc://{tmp_path}/{k}" for k in ("fi", "fo", "wi", "wo")}
    lp = CoreLoop(CoreConfig(ep["fi"], ep["fo"], ep["wi"], ep["wo"]), ctx)
    small = ModelInfo("m", num_blocks=4, block_size=16, max_model_len=128, vocab_size=300,
                      eos_ids=[256])
    lp.info, lp.engine = small, lp.cfg.make_engine(small)
    sent = []
    monkeypatch.setattr(lp, "send", sent.append)
    try:
        for fid, prompt, max_tokens in ((0, [1] * 40, 60), (1, [1] * 70, 1), (2, [1] * 63, 1)):
            lp.add(AddRequest(fid, f"r{fid}", I32(prompt), max_tokens, 0, SamplingParams()))
        assert [(r.fid, r.code, r.param) for r in sent] == [(0, 400, "max_tokens"),
                                                           (1, 400, "prompt")]
        lp.add(AddRequest(3, "r3", I32([1, 2]), 2 ** 63, 0, SamplingParams()))
        assert (sent[-1].code, sent[-1].param) == (400, "max_tokens")
    finally:
        lp.close()
        ctx.term()
