"""The gateway as serve runs it (scripts/serve --http-port 0): the `http` line, /metrics
in Prometheus' text format moving with traffic, /health going 503 when a process dies,
and SIGTERM draining an in-flight HTTP request before serve exits 0 (the module's last
test: it ends the module's group, whose teardown still checks the exit code and the log).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frontend.client import Client
from scripts.group.harness import start_group
from tests.frontend.test_http import ROOT, assert_openai_error, http

GROUP_ARGS = ["--http-port", "0"]


@pytest.fixture(scope="module")
def gateway(group) -> str:
    """serve prints `http URL` right after `ready ADDRESS` (start_group reads it)."""
    assert group.http.startswith("http://127.0.0.1:"), group.http
    return group.http


@pytest.fixture(scope="module")
def oai(gateway):
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as c:
        yield c


def scrape(url: str) -> dict[tuple, float]:
    """(sample name, sorted label items) -> value, from /metrics."""
    status, headers, text = http("GET", url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def moved(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_serve_answers_http_with_urllib(gateway):
    status, _, reply = http("POST", gateway + "/v1/completions",
                            {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert status == 200 and reply["object"] == "text_completion", reply
    assert reply["usage"]["total_tokens"] == (reply["usage"]["prompt_tokens"]
                                              + reply["usage"]["completion_tokens"])
    status, _, reply = http("GET", gateway + "/health")
    assert (status, reply["status"]) == (200, "ok"), reply
    assert [(r["replica"], r["ok"], r["joined"]) for r in reply["replicas"]] == [(0, True, False)]


def test_the_frontend_and_the_gateway_run_without_torch(group, gateway):
    """frontend/torchless.py: neither maps libtorch; the worker, the control, does."""
    def maps(needle: str) -> str:
        with open(f"/proc/{group.pid_of(needle)}/maps") as f:
            return f.read()
    assert "libtorch" in maps("-m worker ")
    for needle in ("-m frontend ", "-m frontend.http "):
        assert "libtorch" not in maps(needle), needle


def test_health_per_replica_checks_local_pids_only():
    from frontend.http.app import replica_health
    me, gone = os.getpid(), 2 ** 22 + 12345   # above pid_max: never a live process
    local = {"replica": 0, "pids": {"core": me, "worker": gone}, "running": 1, "waiting": 0}
    assert replica_health(local) == {"replica": 0, "joined": False, "ok": False,
                                     "dead": ["worker"], "running": 1, "waiting": 0}
    joined = {"replica": 1, "joined": True, "pids": {"core": gone, "worker": gone}}
    assert replica_health(joined)["ok"]


def test_metrics_parse_and_move_with_traffic(gateway, oai, group):
    before = scrape(gateway)
    a = oai.completions.create(model="tiny", prompt="count me", max_tokens=6, temperature=0,
                               extra_body={"ignore_eos": True})
    chunks = list(oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "and me"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    b = chunks[-1].usage
    assert http("POST", gateway + "/v1/completions", {"prompt": "x", "n": 17})[0] == 400
    after = scrape(gateway)

    assert moved(before, after, "tl_http_requests_total", path="/v1/completions", code="200") == 1
    assert moved(before, after, "tl_http_requests_total", path="/v1/chat/completions",
                 code="200") == 1
    assert moved(before, after, "tl_http_requests_total", path="/v1/completions", code="400") == 1
    assert moved(before, after, "tl_requests_finished_total", finish_reason="length") == 2
    assert moved(before, after, "tl_prompt_tokens_total") == (a.usage.prompt_tokens
                                                              + b.prompt_tokens)
    assert moved(before, after, "tl_completion_tokens_total") == 6 + 5
    assert moved(before, after, "tl_time_to_first_token_seconds_count") == 2
    assert moved(before, after, "tl_time_per_output_token_seconds_count") == 2
    assert moved(before, after, "tl_engine_steps_total") >= 11
    # every step, not one mean per scrape (exact count: tests/frontend/test_http_tools.py)
    assert moved(before, after, "tl_step_duration_seconds_count") >= 11
    with Client(group.address) as c:
        total = c.stats()["total_blocks"]
    assert after[("tl_kv_blocks_capacity", ())] == total
    assert after[("tl_kv_blocks_used", ())] == 0
    assert after[("tl_requests_running", ())] == after[("tl_requests_waiting", ())] == 0
    assert after[("tl_engine_up", ())] == 1
    assert ("tl_preemptions_total", ()) in after


@pytest.mark.slow  # keeps the default suite under 5 minutes; CI runs it
def test_health_503_while_the_worker_is_replaced(tmp_path):
    """(A dead gateway is restarted: tests/group/test_faults.py.)"""
    g = start_group(tmp_path, ["--http-port", "0"], log=False)
    try:
        url = g.http
        assert http("GET", url + "/health")[0] == 200
        with Client(g.address) as c:
            pids = c.stats()["pids"]
        os.kill(pids["worker"], signal.SIGKILL)  # serve starts another: 503 meanwhile
        deadline = time.monotonic() + 20
        while (reply := http("GET", url + "/health", timeout=10))[0] == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert reply[0] == 503
        assert_openai_error(reply[2], 503)
    finally:
        g.stop()


def test_a_non_loopback_http_host_needs_allow_remote():
    for cmd in (["-m", "scripts.group.supervisor", "--http-port", "0", "--http-host", "0.0.0.0", "--no-log"],
                ["-m", "frontend.http", "--frontend", "tcp://127.0.0.1:1", "--host", "0.0.0.0"]):
        r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=60,
                           check=False, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 2 and "--allow-remote" in r.stderr, r.stderr
