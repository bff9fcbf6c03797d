"""scripts/bench tool_calls's pure parts: the 64 tool prompts, the body of each mode, the
scoring of a reply and the summary, and its report table. Fast, no group (the benchmark
itself is run by the lead; tests/group/test_tool_calls_trained.py runs it on 4 prompts)."""
from __future__ import annotations

import json

import pytest

from frontend.http.tools import tool_ask
from scripts.benchmarks import _report_tables as rt
from scripts.benchmarks._tool_prompts import FUNCTIONS, OFFERED, body, cases, score, summarize


def reply(calls=(), content=None, finish="tool_calls") -> dict:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call_{k}", "type": "function",
                                  "function": {"name": n, "arguments": a}}
                                 for k, (n, a) in enumerate(calls)]
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def test_sixty_four_prompts_each_offering_its_function_and_two_others():
    cs = cases()
    assert len(cs) == 64 and len({c.question for c in cs}) == 64
    names = [f["function"]["name"] for f in FUNCTIONS]
    assert {c.tool for c in cs} == set(names)
    assert all(sum(c.tool == n for c in cs) == 8 for n in names)
    for c in cs:
        offered = [t["function"]["name"] for t in c.tools]
        assert c.tool in offered and len(set(offered)) == OFFERED
    assert len({[t["function"]["name"] for t in c.tools].index(c.tool) for c in cs}) == OFFERED
    assert cases(4) == cs[:4]
    # half the schemas say nothing of additionalProperties: issue 52's shape
    assert sum("additionalProperties" not in f["function"]["parameters"] for f in FUNCTIONS) == 4


@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_every_body_is_one_the_gateway_accepts(mode):
    for c in cases():
        b = body(c, mode, 512)
        ask = tool_ask(b)   # raises a 400 where the gateway would refuse it
        assert ask.choice == mode and ask.parallel and b["temperature"] == 0
        if mode == "named":
            assert ask.name == c.tool
    assert "parallel_tool_calls" not in body(cases()[0], "required", 8)


def test_a_usable_call_is_an_offered_function_with_arguments_valid_under_its_schema():
    c = next(x for x in cases() if x.tool == "get_weather")
    good = ("get_weather", '{"city":"Paris","unit":"celsius"}')
    m = score(c, 200, reply([good]))
    assert m["ok"] and m["usable"] and m["right_tool"] and m["calls"] == 1 and not m["leaked"]
    other = next(t["function"]["name"] for t in c.tools if t["function"]["name"] != c.tool)
    assert not score(c, 200, reply([(other, "{}")]))["right_tool"]
    for bad in [("get_weather", '{"unit":"celsius"}'),            # city required
                ("get_weather", '{"city":"P","unit":"kelvin"}'),  # not in the enum
                ("get_weather", '{"city":'),                      # no JSON
                ("get_weather", "[1]"),                           # not an object
                ("not_offered", "{}")]:
        assert not score(c, 200, reply([bad]))["usable"], bad
    assert not score(c, 200, reply([good, ("get_weather", "{}")]))["usable"]   # every call


def test_ok_needs_the_tool_calls_finish_and_leaks_are_counted():
    c = cases()[0]
    args = json.dumps({"city": "Paris"})
    cut = score(c, 200, reply([("get_weather", args)], "<tool_call>\n{\"na", "length"))
    assert cut["usable"] and not cut["ok"] and cut["leaked"] and cut["finish_reason"] == "length"
    assert not score(c, 200, reply(content="It is sunny.", finish="stop"))["usable"]
    prose = score(c, 200, reply(content="Write <tool_call></tool_call> tags.", finish="stop"))
    assert not prose["leaked"]   # a closed block that is no call is the model's text
    err = score(c, 400, "bad")
    assert err["error"] and not err["ok"]


def test_summary_shares_and_the_report_table():
    c = cases()[0]
    marks = [score(c, 200, reply([("get_weather", '{"city":"Rome"}')])),
             score(c, 200, reply(content="no", finish="stop")),
             score(c, 200, reply([("get_weather", '{"city":"Rome"}')], finish="length")),
             score(c, 500, "boom")]
    s = summarize(marks)
    assert (s["requests"], s["ok_share"], s["usable_share"], s["tool_calls_finish_share"],
            s["errors"], s["calls_per_reply"]) == (4, 0.25, 0.5, 0.25, 1, 0.5)
    assert s["finish_reasons"] == {"tool_calls": 1, "stop": 1, "length": 1, "None": 1}
    assert summarize([])["ok_share"] is None
    doc = {"benchmark": "tool_calls", "workload": {"max_tokens": 512},
           "results": {"required": s}}
    assert rt.kind(doc) == "tool_calls"
    assert "| required | 4 | 25.0 | 50.0 | 25.0 |" in rt.table(doc)
