"""What the client-library tests check of a flow's result: the tool installed (or the test
fails with pip's lines), tool calls whose arguments hold under the schema sent, and no
tool-call markup left in a reply's text."""
from __future__ import annotations

import json

import jsonschema
import pytest

from scripts.evaltools.clients import run_flow
from scripts.evaltools.toolenv import Tool, ToolInstallFailed, bin_dir

MARKUP = ("<tool_call>", "</tool_call>")   # smollm2's template wraps a call in these


def flows(tool: Tool, script: str, gateway: str):
    """A runner of `script`'s flows against the gateway; the tool is installed first (once,
    cached), and a failed install fails the test with pip's last lines, never skips it."""
    try:
        bin_dir(tool)
    except ToolInstallFailed as e:
        pytest.fail(str(e))
    return lambda flow: run_flow(tool, script, gateway + "/v1", flow)


def assert_no_markup(text: str | None) -> None:
    assert not any(m in (text or "") for m in MARKUP), text


def assert_valid_calls(out: dict, most: int = 8, name: str | None = None) -> list[dict]:
    """The reply ended on its calls, 1..most of them, each one's arguments (a dict, or the
    JSON string the wire carries) valid under the schema the flow sent for its function."""
    assert out["finish_reason"] == "tool_calls", out
    calls = out["tool_calls"]
    assert 1 <= len(calls) <= most, out
    for call in calls:
        args = call["args"] if "args" in call else json.loads(call["arguments"])
        jsonschema.validate(args, out["schemas"][call["name"]])
        assert name in (None, call["name"]), out
    assert not out.get("invalid_tool_calls"), out
    assert_no_markup(out["content"])
    return calls
