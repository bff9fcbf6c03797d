"""Compile floods through a group on `tiny` (issue 50, item 2; docs/structured.md, "The compile
budget" and "Built before the step"): two clients each send new schemas slow to compile while
a plain client streams; the plain stream's longest gap between tokens stays under 3x its
unloaded one (measured in the same test), the flooders get 429s past their budget, over ZeroMQ
and HTTP, and the engine serves on."""
from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from frontend.client import Client, ClientError
from tests.frontend import test_http
from tests.frontend.test_compile_bound import SLOWER, json_format, refusal
from tests.frontend.test_compile_check import new_slow_schema
from tests.waiting import wait_until

PER_S = 0.5      # --new-constraints-per-s: bursts of 4
GROUP_ARGS = ["--new-constraints-per-s", str(PER_S), "--max-compile-ms", "5000"]
VICTIM_TOKENS = 1000

pytestmark = pytest.mark.slow


def test_a_slow_compile_does_not_hold_other_streams(group):
    """The compile runs in the frontend's compile process: its loop forwards the stream's
    deltas meanwhile (on this group, whose bound of 5 s lets a slow compile run to its end).

    A held loop forwards nothing between the compile's start and its refusal, every time. A
    machine under outside load can stall any stream for a few hundred ms with no compile at
    all (measured: 0.68 s in a plain 0.7 s sleep beside two busy processes), so each try
    compiles a new constraint and one try in three must show the stream going on."""
    with Client(group.address, timeout=60) as engine:
        tries = [stream_during_a_compile(group, engine, n) for n in range(3)]
    for took, during, max_gap in tries:
        if took < 0.3:   # a machine this fast leaves too short a compile to see the loop at work
            pytest.skip(f"the slow constraint compiled in {took:.2f} s")
        if len(during) >= 3 and max_gap < took / 2:
            return
    pytest.fail(f"(compile s, deltas during it, longest gap s) of each try: "
                f"{[(round(t, 3), len(d), round(g, 3)) for t, d, g in tries]}")


def stream_during_a_compile(group, engine, n: int) -> tuple[float, list[float], float]:
    """How long a new slow constraint (SLOWER, made distinct by `n`) took to be refused, the
    stream's arrival times meanwhile, and the longest gap between them (or the ends)."""
    arrivals: list[float] = []
    started = threading.Event()
    deadline = [float("inf")]

    def stream():
        with Client(group.address, timeout=60) as c:
            for d in c.stream("z", max_tokens=1500, ignore_eos=True, temperature=1.0, seed=1):
                arrivals.append(time.monotonic())
                started.set()
                if len(arrivals) > 1 and arrivals[-1] > deadline[0]:
                    break

    t = threading.Thread(target=stream)
    t.start()
    try:
        assert started.wait(60)
        sent = time.monotonic()
        err, took = refusal(engine, f"slower-{n}",   # a description makes it a new key
                            response_format=json_format(SLOWER, description=f"try {n}"))
        answered = sent + took
        deadline[0] = answered + 0.2
    finally:
        t.join(60)
    assert (err.code, err.param) == (400, "response_format"), err
    during = [a for a in arrivals if sent <= a <= answered]
    gaps = [b - a for a, b in zip([sent, *during], [*during, answered])]
    return took, during, max(gaps)


def longest_gap(address: str, seed: int) -> float:
    arrivals = []
    with Client(address, timeout=120) as c:
        for _ in c.stream("plain", max_tokens=VICTIM_TOKENS, ignore_eos=True,
                          temperature=1.0, seed=seed):
            arrivals.append(time.monotonic())
    assert len(arrivals) > VICTIM_TOKENS / 4
    return max(b - a for a, b in zip(arrivals, arrivals[1:]))


def flood(address: str, who: str, stop: threading.Event, tally: dict) -> None:
    with Client(address, timeout=120) as c:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                c.generate("x", max_tokens=4, request_id=f"{who}-{i}",
                           structured_outputs={"json": json.dumps(new_slow_schema(f"{who}-{i}"))})
                tally["ok"] += 1
            except ClientError as e:
                tally[e.code] = tally.get(e.code, 0) + 1
                tally["message"] = e.message
                time.sleep(0.05)   # a 429 is cheap, but a client that spins on it is a CPU flood


def flood_round(address: str, name: str) -> tuple[float, float, list[dict]]:
    """(the plain stream's longest gap unloaded, the same while two clients flood, their
    tallies: successes, counts by error code and the last message). `name` makes the
    flooders' schemas new to the engine."""
    unloaded = longest_gap(address, seed=1)
    stop = threading.Event()
    tallies = [{"ok": 0}, {"ok": 0}]
    flooders = [threading.Thread(target=flood, args=(address, f"{name}f{k}", stop, t))
                for k, t in enumerate(tallies)]
    for t in flooders:
        t.start()
    try:
        time.sleep(0.5)   # the flood under way
        loaded = longest_gap(address, seed=2)
        # sequential flooders reach their budget's end in a few seconds of refills
        wait_until(lambda: all(t.get(429) for t in tallies), 60, what="429s for both")
    finally:
        stop.set()
        for t in flooders:
            t.join(120)
    print(f"longest gap: unloaded {unloaded * 1e3:.1f} ms, flooded {loaded * 1e3:.1f} ms;"
          f" flooders {tallies}")
    return unloaded, loaded, tallies


@pytest.fixture(scope="module")
def flooded(group) -> tuple[float, float, list[dict]]:
    longest_gap(group.address, seed=0)   # warm
    return flood_round(group.address, "a")


def test_flooders_get_429s_past_their_budget_and_the_engine_serves_on(group, flooded):
    for tally in flooded[2]:
        assert tally["ok"] >= 1 and tally.get(429, 0) >= 1, tally
        assert "--new-constraints-per-s" in tally["message"]
    with Client(group.address, timeout=60) as c:
        r = c.generate("y", max_tokens=8, structured_outputs={"regex": "[ab]{3}"})
        assert r.finish_reason == "stop" and len(r.text) == 3


def test_a_plain_stream_keeps_its_pace_under_the_flood(group, flooded):
    """Under 3x in 20 of 22 runs and 10 of 10 (Zen 5; docs/structured.md, "Built before the
    step"); the machine's other load can stall any process once for as long (a plain
    sleep: the first test's docstring), so a miss gets one more round, measured afresh,
    unloaded and flooded."""
    unloaded, loaded, _ = flooded
    if loaded >= 3 * unloaded:
        unloaded, loaded, _ = flood_round(group.address, "b")
    assert loaded < 3 * unloaded, (loaded, unloaded)


def test_over_http_past_the_budget_is_a_429(group, tmp_path):
    proc, url = test_http.start_gateway(group.address, tmp_path)
    try:
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as oai:
            refused = None
            for i in range(12):   # the gateway's engine client's bucket holds 4
                fmt = {"type": "json_schema", "json_schema": {
                    "name": "s", "schema": {"type": "object", "title": f"h{i}", "properties": {
                        "a": {"type": "integer"}}}}}
                try:
                    oai.chat.completions.create(model="tiny", max_tokens=4, response_format=fmt,
                                                messages=[{"role": "user", "content": "hi"}])
                except openai.RateLimitError as e:
                    refused = e
                    break
            assert refused is not None and refused.response.headers.get("Retry-After")
            assert "--new-constraints-per-s" in str(refused)
            assert refused.body.get("param") == "response_format", refused.body
    finally:
        assert test_http.stop_gateway(proc) == 0
