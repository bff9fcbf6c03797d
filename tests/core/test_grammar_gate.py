"""The core's grammar gate alone (core/grammar_gate.py; docs/structured.md, "Built before the
step"): a constrained request waits outside the engine until its worker holds the grammar,
each key is asked for once, stale answers are ignored and a new worker is asked again."""
from __future__ import annotations

from core.grammar_gate import GrammarGate
from core.ipc.protocol import I32, AddRequest, Constraint, GrammarReady, SamplingParams

PID = 41
A, B = Constraint("regex", "a+"), Constraint("json", '{"type":"integer"}')


def add(fid: int, c: Constraint | None) -> AddRequest:
    return AddRequest(fid=fid, request_id=f"r{fid}", prompt=I32([1, 2]), max_tokens=4,
                      priority=0, sampling=SamplingParams(constraint=c))


def gate() -> GrammarGate:
    g = GrammarGate()
    g.worker_pid = PID
    return g


def test_a_request_without_a_constraint_passes_at_once():
    assert gate().admit(add(1, None), None) == (True, None)


def test_a_new_key_waits_and_is_asked_for_once():
    g = gate()
    go, ask = g.admit(add(1, A), 1.0)
    assert not go and (ask.key, ask.kind, ask.text) == (A.key, "regex", "a+")
    assert g.admit(add(2, A), 2.0) == (False, None)   # asked already
    go, ask_b = g.admit(add(3, B), 3.0)
    assert not go and ask_b.key == B.key
    assert len(g) == 3
    released = g.ready(GrammarReady(key=A.key, pid=PID))
    assert [(p.msg.fid, p.received) for p in released] == [(1, 1.0), (2, 2.0)]
    assert g.admit(add(4, A), None) == (True, None)   # held now: no wait
    assert len(g) == 1


def test_a_stale_worker_answer_releases_nothing():
    g = gate()
    g.admit(add(1, A), None)
    assert g.ready(GrammarReady(key=A.key, pid=PID + 1)) == []
    assert g.admit(add(2, A), None) == (False, None)
    assert [p.msg.fid for p in g.ready(GrammarReady(key=A.key, pid=PID))] == [1, 2]


def test_forget_and_drop_all_take_waiting_requests_out():
    g = gate()
    for fid in (1, 2, 3):
        g.admit(add(fid, A if fid < 3 else B), None)
    assert g.forget(2) and not g.forget(2) and not g.forget(99)
    assert [p.msg.fid for p in g.drop_all()] == [1, 3]
    assert len(g) == 0
    assert g.ready(GrammarReady(key=A.key, pid=PID)) == []
    assert g.admit(add(4, B), None) == (False, None)   # B's build goes on: not asked again


def test_the_held_keys_are_bounded_most_recently_used_first():
    g = GrammarGate(size=2)
    g.worker_pid = PID
    keys = [Constraint("regex", f"x{i}") for i in range(3)]
    for fid, c in enumerate(keys):
        g.admit(add(fid, c), None)
        g.ready(GrammarReady(key=c.key, pid=PID))
    assert g.admit(add(10, keys[0]), None)[0] is False   # the oldest was forgotten
    assert g.admit(add(11, keys[2]), None) == (True, None)


def test_a_new_worker_is_asked_for_what_waits_and_what_runs():
    g = gate()
    g.admit(add(1, A), None)
    g.admit(add(2, B), None)
    g.ready(GrammarReady(key=B.key, pid=PID))
    c = Constraint("choice", '["x","y"]')
    asks = g.new_worker(PID + 1, [B, c, B])
    assert sorted(a.key for a in asks) == sorted({A.key, B.key, c.key})
    assert g.admit(add(3, B), None)[0] is False   # the new worker holds nothing yet
    assert g.ready(GrammarReady(key=A.key, pid=PID)) == []   # the old worker's answer
    assert [p.msg.fid for p in g.ready(GrammarReady(key=A.key, pid=PID + 1))] == [1]
