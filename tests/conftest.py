"""Shared fixtures: a process group per module (scripts/serve), stopped in teardown."""
from __future__ import annotations

import pytest

from scripts.grouplib import Group, start_group


@pytest.fixture(scope="module")
def group(request, tmp_path_factory) -> Group:
    """The default group: tiny model; a module can override `group_args`."""
    args = getattr(request.module, "GROUP_ARGS", [])
    g = start_group(tmp_path_factory.mktemp("group"), args)
    try:
        yield g
    finally:
        g.stop()
