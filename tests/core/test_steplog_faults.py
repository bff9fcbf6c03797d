"""The step log degrades loudly and safely: a full disk, a removed or replaced file, the
WAL checkpoint, and what the core does meanwhile (offline engine + StepLog)."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from replay.__main__ import main as replay_main
from replay.logfile import LogFile
from replay.verify import verify
from scripts import ROOT
from tests.logfaults import INFO, DiskFull, count, engine_for, new_log, run_steps
from tests.waiting import wait_until



def verified(path) -> int:
    v = verify(LogFile(str(path)))
    assert v.ok, v.divergence
    return v.steps


def test_disk_full_is_retried_and_nothing_is_lost(tmp_path, monkeypatch, capfd):
    disk = DiskFull(monkeypatch)
    path = tmp_path / "steps.db"
    log = new_log(path)
    engine = engine_for(log)
    run_steps(engine, 10)
    wait_until(lambda: log.backlog == 0, what="the first steps")
    disk.full = True
    while log.problem is None:  # the step loop never sees an exception
        run_steps(engine, 5)
        wait_until(lambda: log.backlog == 0 or log.problem, what="a write error")
    assert log.problem == "step log: database or disk is full"
    assert log.refusal() == log.problem and log.abort_reason() is None
    run_steps(engine, 20)
    assert log.backlog > 0
    logged = count(path)
    assert 10 <= logged < engine.step_no
    assert verified(path) == logged  # what is on disk is a prefix of the run
    disk.full = False
    wait_until(lambda: log.backlog == 0 and log.problem is None, what="recovery")
    assert log.refusal() is None
    run_steps(engine, 5)
    log.close()
    assert verified(path) == engine.step_no
    err = capfd.readouterr().err
    assert "database or disk is full" in err and "again after" in err


def test_stop_mode_asks_to_abort_past_the_backlog_bound(tmp_path, monkeypatch):
    disk = DiskFull(monkeypatch)
    log = new_log(tmp_path / "steps.db", max_backlog=200)
    engine = engine_for(log)
    run_steps(engine, 3)
    disk.full = True
    wait_until(lambda: (run_steps(engine, 5), log.problem)[1], what="a write error")
    while log.backlog <= 200:
        assert log.abort_reason() is None
        run_steps(engine, 5)
    assert log.abort_reason().startswith("step log: database or disk is full; ")
    engine.abort_all()  # what the core does (CoreLoop.shed)
    disk.full = False
    log.close()
    assert verified(tmp_path / "steps.db") == engine.step_no


def test_serve_mode_drops_steps_and_records_the_gap(tmp_path, monkeypatch, capfd):
    disk = DiskFull(monkeypatch)
    path = tmp_path / "steps.db"
    log = new_log(path, on_error="serve", max_backlog=100)
    engine = engine_for(log)
    run_steps(engine, 5)
    disk.full = True
    wait_until(lambda: (run_steps(engine, 5), log.problem)[1], what="a write error")
    assert log.refusal() is None and log.abort_reason() is None
    run_steps(engine, 60)
    assert log.backlog <= 100 + 50  # bounded: the rest was dropped
    disk.full = False
    wait_until(lambda: log.problem is None, what="recovery")
    run_steps(engine, 5)
    log.close()
    with sqlite3.connect(path) as conn:
        gaps = conn.execute("SELECT first_step, last_step, records, reason FROM gaps").fetchall()
        steps = {r[0] for r in conn.execute("SELECT step FROM steps")}
    assert len(gaps) == 1
    first, last, records, reason = gaps[0]
    assert 5 < first <= last < engine.step_no - 5 and records > 0
    assert reason == "step log: database or disk is full"
    assert steps == set(range(engine.step_no)) - set(range(first, last + 1))
    assert "serving on without logging" in capfd.readouterr().err
    assert replay_main(["verify", str(path)]) == 2
    err = capfd.readouterr().err
    assert f"steps {first}..{last} were not logged" in err and err.count("\n") == 1


def test_removed_file_is_restored_with_every_step(tmp_path, capfd):
    path = tmp_path / "steps.db"
    log = new_log(path)
    engine = engine_for(log)
    run_steps(engine, 20)
    wait_until(lambda: log.backlog == 0, what="the first steps")
    os.remove(path)
    run_steps(engine, 10)
    wait_until(path.exists, what="the restored file")
    run_steps(engine, 10)
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.db"]  # no stale -wal
    assert log.path == str(path)
    assert verified(path) == engine.step_no == 40
    assert f"{path} was removed while in use; restored it" in capfd.readouterr().err


def test_replaced_file_is_left_alone_and_the_log_goes_on_beside_it(tmp_path, capfd):
    path = tmp_path / "steps.db"
    log = new_log(path)
    engine = engine_for(log)
    run_steps(engine, 20)
    other = tmp_path / "other.db"
    other.write_bytes(b"someone else's file")
    os.replace(other, path)
    wait_until(lambda: log.path != str(path), what="the move")
    run_steps(engine, 10)
    log.close()
    assert path.read_bytes() == b"someone else's file"
    assert log.path == str(tmp_path / "steps.recovered.db")
    assert verified(log.path) == engine.step_no == 30
    assert "was replaced while in use; that path is left alone" in capfd.readouterr().err


def test_unrestorable_file_is_a_problem_until_it_can_be_restored(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    path = folder / "steps.db"
    log = new_log(path)
    engine = engine_for(log)
    run_steps(engine, 10)
    shutil.rmtree(folder)
    problem = wait_until(lambda: log.problem, what="the problem")
    assert problem.startswith("step log file was removed and cannot be restored: ")
    assert log.refusal() == problem
    run_steps(engine, 10)  # still written, into the open (removed) file
    folder.mkdir()
    wait_until(path.exists, what="the restored file")
    wait_until(lambda: log.problem is None, what="no problem")
    run_steps(engine, 5)
    log.close()
    assert verified(path) == engine.step_no == 25


def test_the_db_file_alone_holds_the_committed_steps(tmp_path):
    """A kill -9 whose -wal file is lost: the checkpoints put the steps in the .db."""
    path = tmp_path / "steps.db"
    script = textwrap.dedent(f"""
        import time
        from tests.logfaults import engine_for, new_log, run_steps
        from tests.waiting import wait_until
        log = new_log({str(path)!r}, checkpoint_s=0.2)
        engine = engine_for(log)
        run_steps(engine, 300)
        wait_until(lambda: log.backlog == 0)
        print(engine.step_no, flush=True)
        time.sleep(60)   # the point: alive, the log open, until the test's kill -9
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)   # the child imports tests.logfaults from there
    try:
        steps = int(proc.stdout.readline())
        wait_until(lambda: count(path) == steps, what="the commits")
        copy = tmp_path / "copy.db"
        wait_until(lambda: (shutil.copy(path, copy), count(copy) == steps)[1], timeout=5,
                   what="the checkpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    shutil.copy(path, copy)  # after the kill, still without the -wal
    assert count(copy) == steps
    assert verified(copy) == steps


def test_without_checkpoints_the_db_file_lags(tmp_path):
    path = tmp_path / "steps.db"
    log = new_log(path, checkpoint_s=float("inf"))
    run_steps(engine_for(log), 100)
    wait_until(lambda: log.backlog == 0, what="the commits")
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    log.close()
    assert count(copy) < 100 == count(path)


def test_the_offline_log_interface_is_uniform():
    from core.engine import NullLog
    null = NullLog()
    assert null.problem is None and null.refusal() is None and null.abort_reason() is None
    null.close()


def test_core_refuses_new_requests_and_aborts_those_in_flight(tmp_path, monkeypatch):
    """CoreLoop.add and CoreLoop.shed on a real CoreLoop whose engine steps offline."""
    import zmq

    from core.ipc.channel import Channel
    from core.config import CoreConfig
    from core.process import CoreLoop
    from core.ipc.protocol import I32, AddRequest, Rejected, SamplingParams

    disk = DiskFull(monkeypatch)
    ctx = zmq.Context()
    ep = [f"ipc://{tmp_path}/{k}" for k in ("fe_in", "fe_out", "wk_in", "wk_out")]
    cfg = CoreConfig(*ep, max_seqs=8, max_batch_tokens=64, overlap=False)  # as logfaults.CFG
    loop = CoreLoop(cfg, ctx)
    frontend = Channel(ctx, zmq.PULL, ep[1], bind=False)
    log = new_log(tmp_path / "steps.db", max_backlog=200)
    loop.engine, loop.info, loop.log = engine_for(log), INFO, log

    def add(fid: int) -> None:
        loop.add(AddRequest(fid, "", I32([5, 6, 7]), 200, 0, SamplingParams(), True))

    def answer() -> Rejected:
        assert frontend.poll(5000)
        return frontend.recv()
    try:
        add(1), add(2)
        disk.full = True
        wait_until(lambda: (loop.engine.step(), log.problem)[1], what="a write error")
        add(3)
        assert answer() == Rejected(3, 503, "step log: database or disk is full")
        loop.shed()
        assert not frontend.poll(100)  # below the bound: the two go on
        while log.abort_reason() is None:
            loop.engine.step()
        loop.shed()
        got = sorted([answer(), answer()], key=lambda r: r.fid)
        assert [(r.fid, r.code) for r in got] == [(1, 503), (2, 503)]
        assert got[0].message.startswith("step log: database or disk is full; ")
        assert not loop.engine.sched.has_unfinished() and not loop.fid_of
        disk.full = False
        wait_until(lambda: log.problem is None, what="recovery")
        add(4)
        assert list(loop.seq_of) == [4]
        loop.engine.run()
    finally:
        loop.close()
        frontend.close()
        ctx.term()
    conn = sqlite3.connect(tmp_path / "steps.db")
    reasons = dict(conn.execute("SELECT id, finish_reason FROM requests"))
    assert reasons == {0: "abort", 1: "abort", 2: "length"}  # logged once writing resumed
    assert verified(tmp_path / "steps.db") > 0
