"""The per-client budget of new constraints alone (frontend/constraint_budget.py;
docs/structured.md, "The compile budget"): a token bucket on a fake clock, one per client,
and a constraint with a kept verdict spends nothing."""
from __future__ import annotations

import pytest

from frontend.compile_check import CompileCheck
from frontend.constraint_budget import ConstraintBudget, OverBudget
from frontend.structured import check_constraint


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_refill_rate():
    clock = Clock()
    b = ConstraintBudget(per_s=2.0, burst=3.0, clock=clock)
    assert [b.take(b"a") for _ in range(4)] == [True, True, True, False]
    clock.now += 0.4   # 0.8 of a token
    assert not b.take(b"a")
    clock.now += 0.1
    assert b.take(b"a") and not b.take(b"a")
    clock.now += 60    # refills to the burst, not past it
    assert [b.take(b"a") for _ in range(4)] == [True, True, True, False]


def test_clients_have_buckets_of_their_own():
    b = ConstraintBudget(per_s=1.0, burst=1.0, clock=Clock())
    assert b.take(b"a") and not b.take(b"a")
    assert b.take(b"b")


def test_the_default_burst_is_seconds_of_refill():
    assert ConstraintBudget(per_s=8.0).burst == 64
    assert ConstraintBudget(per_s=0.01).burst == 1   # at least one


def test_full_buckets_are_forgotten_and_start_full_again(monkeypatch):
    monkeypatch.setattr("frontend.constraint_budget.PRUNE_FROM", 4)
    clock = Clock()
    b = ConstraintBudget(per_s=1.0, burst=2.0, clock=clock)
    b._prune_at = 4
    for i in range(4):
        b.take(bytes([i]))
    clock.now += 10
    b.take(b"x")   # the fifth bucket: the four full ones go
    assert set(b._buckets) == {b"x"}
    assert b.take(b"\x00") and b.take(b"\x00") and not b.take(b"\x00")


def test_a_kept_verdict_spends_nothing_and_a_new_one_is_refused_past_the_budget():
    b = ConstraintBudget(per_s=1.0, burst=1.0, clock=Clock())
    compiles = CompileCheck()

    def spend(field):
        if not b.take(b"c"):
            raise b.refusal(field)

    class Req:
        response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}
        structured_outputs = None

    other = type("Other", (), {"response_format": None,
                               "structured_outputs": {"regex": "[0-9]+"}})
    assert check_constraint(Req, compiles, spend) is not None   # the one token
    for _ in range(3):
        assert check_constraint(Req, compiles, spend) is not None   # kept: free
    with pytest.raises(OverBudget) as e:
        check_constraint(other, compiles, spend)
    assert (e.value.code, e.value.field) == (429, "structured_outputs")
    assert "--new-constraints-per-s" in str(e.value)
    assert compiles.compiles == 1   # the refused one was never compiled
