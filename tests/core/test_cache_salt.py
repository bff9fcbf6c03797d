"""Tenant isolation of the prefix cache (docs/security.md, "Prefix cache isolation"): a
request's cache_salt starts its chain of block keys, so only equal salts share blocks."""
from __future__ import annotations

import pytest

from core.prefix_cache import _ROOT, chain_root
from core.sched import Chunked, InvalidRequest, Request, Scheduler, SchedulerConfig
from core.bounds import MAX_CACHE_SALT_CHARS
from tests.core.test_prefix_cache import Checked, toks
from tests.fake_model import FakeModel, run

PROMPT = toks(13, 9)   # three full blocks of 4, then one token


def cached_after(first: str | None, second: str | None) -> int:
    """The cached tokens the second of two equal prompts finds, the first computed."""
    c = Checked(4, range(16))
    c.allocate("a", PROMPT, salt=first)
    c.release("a", PROMPT)
    found = c.cached_prefix(PROMPT, second)
    alloc = c.allocate("b", PROMPT, salt=second)
    if alloc.cached_tokens != found:
        raise AssertionError("cached_prefix disagrees with allocate")
    return alloc.cached_tokens


@pytest.mark.parametrize("first, second, shared", [
    ("tenant-a", "tenant-a", 12), (None, None, 12),
    ("tenant-a", "tenant-b", 0), (None, "tenant-a", 0), ("tenant-a", None, 0),
    ("", None, 0)])
def test_only_equal_salts_share_blocks(first, second, shared):
    assert cached_after(first, second) == shared


def test_the_root_is_unsalted_without_a_salt_and_differs_per_salt():
    assert chain_root(None) == _ROOT
    roots = {chain_root(s) for s in ("", "a", "b", "ab")}
    assert len(roots) == 4 and _ROOT not in roots
    assert chain_root("a") == chain_root("a")   # the same in every process: a digest


def test_a_salted_chain_is_kept_apart_while_both_run():
    c = Checked(4, range(16))
    c.allocate("a", PROMPT, salt="x")
    c.computed("a", PROMPT, 12)
    assert c.allocate("b", PROMPT, salt="y").cached_tokens == 0
    assert not set(c.block_table("a")) & set(c.block_table("b"))
    assert c.allocate("c", PROMPT, salt="x").cached_tokens == 12


def scheduler() -> Scheduler:
    cfg = SchedulerConfig(max_seqs=8, max_batch_tokens=64, max_model_len=64)
    return Scheduler(cfg, Checked(4, range(32)), Chunked(64))


@pytest.mark.parametrize("salt, want", [("victim", 12), ("attacker", 0), (None, 0)])
def test_the_scheduler_shares_blocks_within_a_salt_only(salt, want):
    sched = scheduler()
    fake = FakeModel()
    run(sched, fake, 50, {0: [Request(PROMPT, 2, cache_salt="victim")]})
    seq_id = sched.add(Request(PROMPT, 2, cache_salt=salt))
    sched.schedule()
    hits = dict(map(tuple, sched.last_hits))
    assert hits.get(seq_id, 0) == want


@pytest.mark.parametrize("salt", [7, b"bytes", "s" * (MAX_CACHE_SALT_CHARS + 1)])
def test_a_bad_salt_is_refused(salt):
    with pytest.raises(InvalidRequest) as e:
        scheduler().add(Request(PROMPT, 2, cache_salt=salt))
    assert e.value.param == "cache_salt"
