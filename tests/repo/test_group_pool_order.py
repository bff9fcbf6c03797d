"""tests/conftest.py's ordering: modules that ask for the same group's flags run one after
another (so the pool starts one group for them); every other module keeps its place."""
from __future__ import annotations

from types import ModuleType, SimpleNamespace

from tests.conftest import pytest_collection_modifyitems


def module(name: str, args=None) -> ModuleType:
    m = ModuleType(name)
    if args is not None:
        m.GROUP_ARGS = args
    return m


def items(*spec):
    """(module, uses the group fixture, n tests) -> fake collected items, in that order."""
    return [SimpleNamespace(module=m, nodeid=f"{m.__name__}::t{i}",
                            fixturenames=["group"] if grouped else ["tmp_path"])
            for m, grouped, n in spec for i in range(n)]


def test_same_flags_move_up_to_the_first_of_them_and_the_rest_keep_their_order():
    a, b, plain, c, d = (module("a", []), module("b", ["--x"]), module("plain"),
                         module("c", []), module("d", ["--x"]))
    got = items((a, True, 2), (b, True, 1), (plain, False, 2), (c, True, 2), (d, True, 1))
    pytest_collection_modifyitems(got)
    assert [i.nodeid for i in got] == ["a::t0", "a::t1", "c::t0", "c::t1", "b::t0", "d::t0",
                                       "plain::t0", "plain::t1"]


def test_a_module_without_the_group_is_not_moved_even_with_flags():
    a, lone, c = module("a", []), module("lone", []), module("c", [])
    got = items((a, True, 1), (lone, False, 1), (c, True, 1))
    pytest_collection_modifyitems(got)
    assert [i.nodeid for i in got] == ["a::t0", "c::t0", "lone::t0"]
