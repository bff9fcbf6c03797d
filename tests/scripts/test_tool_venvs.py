"""tests/tool_venvs.py: which tool venvs a session installs in the background, from the
selected tests' markers."""
from __future__ import annotations

import pytest

from scripts.evaltools.toolenv import GUIDELLM, LITELLM, LM_EVAL
from tests import tool_venvs


class Item:
    def __init__(self, *marks):
        self.marks = marks

    def iter_markers(self, name):
        return iter(m for m in self.marks if m.name == name)


def test_the_tools_are_those_the_items_name_in_first_use_order_once_each():
    items = [Item(pytest.mark.slow.mark), Item(pytest.mark.tool_venvs(LITELLM).mark),
             Item(pytest.mark.tool_venvs(LM_EVAL, LITELLM).mark, pytest.mark.slow.mark),
             Item(pytest.mark.tool_venvs(GUIDELLM, LM_EVAL, GUIDELLM).mark)]
    assert tool_venvs.needed(items) == [LITELLM, LM_EVAL, GUIDELLM]


def test_nothing_to_install_starts_no_thread():
    assert tool_venvs.start_installs([Item(pytest.mark.slow.mark)]) is None
