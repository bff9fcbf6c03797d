"""scripts/bench overhead's in-run forward time: the worker writes its time per batch to the
file TL_WORKER_TIMES names (worker/process.py), the benchmark averages it over the steps it
measures (scripts/benchmarks/overhead.py). Its sink reads the frontend's frames as plain
msgpack maps; its client mode reads them as AsyncClient streams (_overhead_drive.py). The
null case runs end to end."""
from __future__ import annotations

import json
import subprocess
import threading
from types import SimpleNamespace

import pytest
import zmq

from core.ipc.channel import Channel, Router
from core.ipc.protocol import (Delta, Deltas, ErrorReply, Generate, Shutdown, StatsReply,
                               StepResult, WorkerReady)
from scripts import ROOT
from scripts.benchmarks import _worker_times as wt
from scripts.benchmarks._overhead_log import worker_ms
from scripts.benchmarks._overhead_drive import Received, sink, streams
from worker.handmade import Part, make_batch
from worker.null import NullRunner
from worker.process import TIMES_ENV, serve



def test_the_worker_writes_one_line_per_batch(tmp_path, monkeypatch):
    times = tmp_path / "times.txt"
    monkeypatch.setenv(TIMES_ENV, str(times))
    ctx = zmq.Context()
    to_core = Channel(ctx, zmq.PULL, f"ipc://{tmp_path}/in", bind=True,
                      accept=(WorkerReady, StepResult))
    from_core = Channel(ctx, zmq.PUSH, f"ipc://{tmp_path}/out", bind=True)
    runner = NullRunner(num_blocks=16, block_size=4)
    t = threading.Thread(target=serve, args=(runner, ctx, f"ipc://{tmp_path}/in",
                                             f"ipc://{tmp_path}/out"), daemon=True)
    t.start()
    try:
        assert to_core.poll(10_000) and isinstance(to_core.recv(), WorkerReady)
        for step in (3, 4, 5):
            from_core.send(make_batch([Part([1, 2, 3], 0, 3, [0])], 4, step=step))
            assert to_core.poll(10_000) and to_core.recv().step == step
        from_core.send(Shutdown())
        t.join(10)
    finally:
        to_core.close()
        from_core.close()
        ctx.term()
    lines = wt.read(times)
    assert [t.step for t in lines] == [3, 4, 5] and all(t.ms >= 0 for t in lines)
    assert all(len(line.split()) == 3 for line in times.read_text().splitlines())
    assert all(t.mask_ms == 0 for t in lines)   # the null runner has no grammars


def test_worker_times_read_a_stretch_and_older_lines_without_the_mask(tmp_path):
    times = tmp_path / "times.txt"
    assert wt.count(times) == 0
    times.write_text("1 10.0\n2 20.0 1.5\n3 40.0 2.5\n")
    assert wt.count(times) == 3
    assert wt.read(times) == [wt.StepTime(1, 10.0, 0.0), wt.StepTime(2, 20.0, 1.5),
                              wt.StepTime(3, 40.0, 2.5)]
    assert [t.step for t in wt.read(times, skip=2)] == [3]


def test_worker_ms_averages_the_measured_steps_and_needs_them_all(tmp_path):
    times = tmp_path / "times.txt"
    times.write_text("1 10.0\n2 20.0\n3 40.0\n")
    rows = [SimpleNamespace(step=2), SimpleNamespace(step=3)]
    assert worker_ms(times, rows) == 30.0
    with pytest.raises(RuntimeError, match="lack steps"):
        worker_ms(times, rows + [SimpleNamespace(step=9)])


def fake_frontend(address: str, n: int, replies) -> threading.Thread:
    """The frontend's own Router, answering `n` Generates, each with `replies(request)`."""
    router = Router(zmq.Context.instance(), address, accept=(Generate,))

    def serve():
        try:
            for _ in range(n):
                if not router.poll(10_000):
                    return
                ident, request = router.recv()
                for msg in replies(request):
                    router.send(ident, msg)
        finally:
            router.sock.close(linger=1000)  # as the frontend closes it: replies still leave
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_the_sink_counts_every_token_and_waits_for_every_finish(tmp_path):
    def replies(g: Generate):
        return [Deltas.of([Delta(g.request_id, "", [7] * (g.max_tokens - 1))]), StatsReply({}),
                Deltas.of([Delta(g.request_id, "", [8], finish_reason="length")])]
    t = fake_frontend(f"ipc://{tmp_path}/fe", 3, replies)
    reqs = [SimpleNamespace(prompt=[1, 2], max_tokens=n) for n in (1, 5, 30)]
    got = Received()
    wall, tokens = sink(f"ipc://{tmp_path}/fe", reqs, timeout=10, received=got)
    assert tokens == 36 and wall > 0
    assert (got.deltas, got.tokens) == (6, 36) and got.last_t > 0
    t.join(15)


def test_streams_read_every_delta_on_one_asyncclient_and_count_the_failed(tmp_path):
    """The client mode: each request a stream of one AsyncClient; a stream that fails is
    counted, not raised (a dropped client is a finding of the run)."""
    def replies(g: Generate):
        if g.max_tokens == 13:
            return [ErrorReply(g.request_id, 503, "lost")]
        return [Deltas.of([Delta(g.request_id, "", [7] * (g.max_tokens - 1))]),
                Deltas.of([Delta(g.request_id, "", [8], finish_reason="length")])]
    t = fake_frontend(f"ipc://{tmp_path}/fe", 4, replies)
    reqs = [SimpleNamespace(prompt=[1, 2], max_tokens=n) for n in (2, 5, 13, 30)]
    got = Received()
    wall, tokens = streams(f"ipc://{tmp_path}/fe", reqs, got, timeout=10)
    assert tokens == 37 == got.tokens and got.deltas == 6 and wall > 0
    assert got.errors == ["503 lost"] and got.last_t > 0
    t.join(15)


def test_the_sink_fails_on_an_error_reply(tmp_path):
    t = fake_frontend(f"ipc://{tmp_path}/fe", 1, lambda g: [ErrorReply(g.request_id, 429, "busy")])
    with pytest.raises(RuntimeError, match="429 busy"):
        sink(f"ipc://{tmp_path}/fe", [SimpleNamespace(prompt=[1], max_tokens=2)], timeout=10)
    t.join(15)


@pytest.mark.slow  # three groups: keeps the default suite under 5 minutes; CI runs it
def test_the_null_case_runs_end_to_end_and_breaks_the_step_down(tmp_path):
    """`scripts/bench overhead` on 16 null-model sequences: two groups (log on, off), the
    log read back, replayed in-process and timed, each process's CPU sampled; then 16
    streams on one AsyncClient. No timing is asserted, only that every part of the
    breakdown is there and the steady steps were the full batch."""
    out = tmp_path / "overhead.json"
    cmd = [str(ROOT / "scripts" / "bench"), "overhead", "--sizes", "16", "--steps", "60",
           "--client-streams", "16", "--skip-smol", "--no-progress", "--allow-dirty",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    case = json.loads(out.read_text())["null"]["16"]
    assert case["full_batch"] and case["batch"] == 16 and case["steady_steps"] >= 10
    assert set(case["parts_ms"]) == {"engine", "codec_core_worker", "null_execute",
                                     "ipc_transport", "between_steps", "step_events_encode"}
    assert case["step_ms"] > 0 and case["parts_ms"]["engine"] > 0
    assert case["codec_ms"]["forward_batch_bytes"] > 0
    for each in (case, json.loads(out.read_text())["asyncclient"]):
        c = each["cpu"]
        assert each["token_ms_at_client"] > 0 and each["lag_s"] is not None
        assert c["steps"] > 0 and c["core_ms_per_step"] > 0 and c["deltas_produced"] > 0
        assert set(c["busy"]) == {"frontend", "core", "worker", "client"}
        assert c["run"]["deltas_received"] == 16 * 60   # every delta, one token each