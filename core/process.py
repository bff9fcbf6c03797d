"""The core process: the step loop between the frontend and the worker.

Inputs from the frontend are drained without blocking between steps (and only between
steps: a step is one schedule -> forward -> on_step round). When nothing is unfinished the
loop blocks on its sockets. The core never imports torch or transformers.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import zmq

from core.config import CoreConfig, log_meta
from core.engine import Engine
from core.frontend_link import BEAT_S, FrontendLink, Refused
from core.frontend_watch import FrontendWatch
from core.grammar_gate import GrammarGate
from core.ipc.protocol import (AbortRequest, AddRequest, CoreReady, CoreStats, GrammarReady,
                           Hello, I32, JoinRefused, ProtocolError, Rejected, StatsQuery,
                           StepEvents, StepResult, StopRequest, WorkerReady)
from core.prompt_logprobs import parts
from core.step_events import embedding_parts
from core.step_commit import StepCommit
from core.step_driver import PlanFailed, drive
from core.step_events import step_messages
from core.steplog import StepLog
from core.worker_link import WorkerDied, WorkerLink, WorkerLost
from core.sched import AdmitError, NeverFits, QueueFull, Request


RESTART_WAIT_S = 300.0   # how long the core waits for a replacement worker


def prefix_stats(blocks) -> dict:
    """The prefix cache's counters (all 0 with --no-prefix-cache)."""
    names = ("prefix_query_tokens", "prefix_hit_tokens", "prefix_recompute_hit_tokens")
    cached = getattr(blocks, "cached_blocks", None)
    return {"prefix_cache": cached is not None, "cached_blocks": cached() if cached else 0,
            **{n: getattr(blocks, n, 0) for n in names}}


def _log(msg: str) -> None:
    print(f"[core] {msg}", file=sys.stderr, flush=True)


class CoreLoop:
    def __init__(self, cfg: CoreConfig, ctx: zmq.Context):
        self.cfg = cfg
        self.link = FrontendLink(ctx, cfg.frontend_in, cfg.frontend_out, cfg.join, cfg.curve)
        self.fe_in, self.fe_out = self.link.fe_in, self.link.fe_out
        self._inbox: list = []   # (input, wall clock read) during a step, applied after it
        self.worker = WorkerLink(ctx, cfg.worker_in, cfg.worker_out, self.fe_in.sock,
                                 cfg.step_timeout, on_news=self._worker_news)
        self.gate = GrammarGate()   # constrained requests wait for their grammar here
        self.engine: Engine | None = None
        self.fid_of: dict[int, int] = {}   # seq_id (the scheduler's) -> fid (the frontend's)
        self.seq_of: dict[int, int] = {}   # fid -> seq_id
        self.info = None
        self.log: StepLog | None = None
        self.frontend = FrontendWatch(local=not self.link.joined)

    # ---- start-up

    def wait_worker(self, timeout: float | None = None) -> WorkerReady:
        """The next WorkerReady; frontend inputs are served meanwhile once the engine runs."""
        return self.worker.wait_ready(timeout, self._serve_inputs)

    def _serve_inputs(self) -> None:
        if self.engine is not None:
            self.drain_inputs(block_ms=0)

    def start(self) -> None:
        msg = self.wait_worker()
        self.info, self.worker.pid = msg.info, msg.pid
        self.gate.worker_pid = msg.pid
        if self.cfg.log:
            self.log = StepLog(self.cfg.log, log_meta(self.cfg, msg.info),
                               on_error=self.cfg.log_errors)
        self.engine = self.cfg.make_engine(msg.info, self.log)
        if why := self.cfg.spec_off(msg.info):
            _log(f"speculative decoding is off: {why}")
        self.announce()
        _log(f"ready: {msg.info.model}, {msg.info.num_blocks} blocks of {msg.info.block_size}")

    def replace_worker(self, why: str, abandon: bool = True) -> None:
        """The step in flight (if any) is abandoned; a new worker recomputes every running
        request from its prompt and generated tokens."""
        t0 = time.monotonic()
        _log(f"worker {self.worker.pid} lost ({why}); waiting for a new one")
        if abandon:
            self.engine.lose_worker()
        self.gate.worker_pid = 0   # the lost worker's GrammarReady still on the way is stale
        msg = self.wait_worker(RESTART_WAIT_S)
        if (msg.info.num_blocks, msg.info.block_size) != (self.info.num_blocks, self.info.block_size):
            raise WorkerLost("the new worker's KV pool differs from the old one's")
        self.worker.pid = msg.pid
        preempted = self.engine.restart()
        live = [c for c in self.engine.constraints() if c is not None]
        for ask in self.gate.new_worker(msg.pid, live):
            self.worker.try_send(ask)
        self.announce()
        _log(f"worker {msg.pid} took over after {time.monotonic() - t0:.2f}s;"
             f" {len(preempted)} request(s) will recompute")

    # ---- the loop

    def run(self) -> None:
        self.start()
        while True:
            busy = self.engine.busy()
            if not busy:
                self.engine.log.flush()
            self.drain_inputs(block_ms=0 if busy else 1000)
            dead = self.frontend.died()
            if dead is not None:
                self.orphan(f"frontend {dead} died")
            if not busy and not self.worker.alive():
                self.replace_worker("it exited while idle", abandon=False)
            self.shed()
            if self.engine.busy():
                self.step()

    def announce(self) -> None:
        """CoreReady to the frontend (dropped if none is connected: it says Hello), with
        the context this core's scheduler takes (--max-model-len may cut the worker's)."""
        info = replace(self.info, max_model_len=self.engine.sched.cfg.max_model_len)
        self.send(CoreReady(info=info, pid=os.getpid(), worker_pid=self.worker.pid,
                            epoch=self.frontend.epoch))

    def send(self, msg) -> None:
        if not self.fe_out.try_send(msg):
            _log(f"no frontend connected: dropped {type(msg).__name__}")

    def drain_inputs(self, block_ms: int) -> None:
        """Apply what came during the step, then what the frontend sent (waiting up to
        `block_ms` for anything from the frontend or the worker)."""
        self.link.beat()
        block_ms = min(block_ms, int(BEAT_S * 1000))
        readable = self.worker.wait_idle(0 if self._inbox else block_ms)
        inbox, self._inbox = self._inbox, []
        for msg, received in inbox:
            self.handle(msg, received)
            self.link.beat()    # thousands of inputs must not silence the core
        if not inbox and not readable:
            return
        for msg in self.read_inputs():
            self.handle(msg)
            self.link.beat()

    def read_inputs(self) -> list:
        """Every frontend message waiting now, without blocking."""
        out = []
        while True:
            try:
                out.append(self.fe_in.recv(zmq.NOBLOCK))
            except zmq.Again:
                return out
            except ProtocolError as e:
                _log(f"dropped a bad frame from the frontend: {e}")

    def collect_inputs(self) -> None:
        """Mid-step: queue inputs for after the step (stats are answered at once)."""
        for msg in self.read_inputs():
            if isinstance(msg, StatsQuery):
                self.handle(msg)
            else:
                self._inbox.append((msg, time.time()))

    def _worker_news(self, msg: GrammarReady) -> None:
        """The worker's word outside a step's result: applied between steps, as inputs are."""
        self._inbox.append((msg, time.time()))

    def handle(self, msg, received: float | None = None) -> None:
        if isinstance(msg, AddRequest):
            self.add(msg, received)
        elif isinstance(msg, GrammarReady):
            for parked in self.gate.ready(msg):
                self.add(parked.msg, parked.received)
        elif isinstance(msg, Hello):
            self.hello(msg)
        elif isinstance(msg, AbortRequest):
            seq_id = self.seq_of.get(msg.fid)
            if seq_id is not None:
                self.drop(seq_id)
            else:
                self.gate.forget(msg.fid)
        elif isinstance(msg, StopRequest):
            self.stop(msg)
        elif isinstance(msg, StatsQuery):
            self.send(CoreStats(qid=msg.qid, stats=self.stats()))
        elif isinstance(msg, JoinRefused):
            raise Refused(msg.reason)

    def hello(self, msg: Hello) -> None:
        """A new frontend, or a new epoch of ours (it dropped this replica, stalled or
        silent, and takes it back as a fresh one): the requests held have nobody to answer
        to, or run elsewhere now. A repeated Hello (a replica may be greeted twice) only
        gets CoreReady again."""
        if self.frontend.greet(msg.pid, msg.epoch):
            self.orphan(f"frontend {msg.pid} greeted this core in epoch {msg.epoch}")
        self.announce()
        if self.link.joined:
            print(f"JOINED {self.cfg.join}", flush=True)   # scripts/serve --join waits for it

    def orphan(self, why: str) -> None:
        """Abort (logged) every request held: the frontend they came from is gone."""
        orphans = list(self.seq_of.values())
        for seq_id in orphans:
            self.drop(seq_id)
        waiting = self.gate.drop_all()
        if orphans or waiting:
            _log(f"{why}: aborted {len(orphans)} request(s) of the frontend before"
                 f" ({len(waiting)} more waited for their grammar)")

    def stop(self, msg: StopRequest) -> None:
        """A stop string ended the request at the frontend: finish it "stop" here too, and
        send the finish (with its metrics) the frontend waits for."""
        seq_id = self.seq_of.pop(msg.fid, None)
        if seq_id is None:
            return  # it finished here first; its finish is on the way
        del self.fid_of[seq_id]
        figures = self.engine.stop(seq_id, max(0, msg.num_tokens))
        self.send(StepEvents(fids=I32(), tokens=I32(), finished=[[msg.fid, "stop", figures]]))

    def add(self, msg: AddRequest, received: float | None = None) -> None:
        refusal = self.engine.log.refusal()  # the step log cannot be written
        if refusal is not None:
            self.send(Rejected(fid=msg.fid, code=503, message=refusal))
            return
        held = self.seq_of.get(msg.fid)
        if held is not None or self.gate.forget(msg.fid):   # the newest is the live one
            _log(f"request {msg.fid} sent again: aborting its earlier copy")
            if held is not None:
                self.drop(held)
        go, ask = self.gate.admit(msg, received)
        if ask is not None:
            self.worker.try_send(ask)
        if not go:   # back through here once the worker holds its grammar
            return
        req = Request(prompt=list(msg.prompt), max_tokens=msg.max_tokens, priority=msg.priority,
                      cache_salt=msg.cache_salt, embed=msg.embed)
        try:
            seq_id = self.engine.add(req, msg.sampling, ignore_eos=msg.ignore_eos,
                                     request_id=msg.request_id, user=msg.user,
                                     key_hash=msg.key_hash,
                                     arrival_time=received)
        except AdmitError as e:
            code = 429 if isinstance(e, QueueFull) else 400
            self.send(Rejected(fid=msg.fid, code=code, message=str(e) or type(e).__name__,
                               param=self._param_of(e, len(msg.prompt))))
            return
        except Exception as e:  # a bug must fail this request, not the engine
            _log(f"request {msg.fid} failed at admission: {e!r}")
            self.send(Rejected(fid=msg.fid, code=500, message=f"internal error: {e!r}"))
            return
        self.fid_of[seq_id], self.seq_of[msg.fid] = msg.fid, seq_id

    def shed(self) -> None:
        """The step log has been unwritable with too much waiting: abort every request."""
        why = self.engine.log.abort_reason()
        if why is None or not self.fid_of:
            return
        _log(f"aborting {len(self.fid_of)} request(s): {why}")
        for seq_id in list(self.fid_of):
            self.drop(seq_id, Rejected(fid=0, code=503, message=why))

    def step(self) -> None:
        """One step through the one driver (core/step_driver.py) on the worker process."""
        try:
            done = drive(self.engine, self)   # this loop is the remote runner: submit, collect
        except PlanFailed as e:
            self.publish(e.settled)
            self.fail_step(e.cause)
        except WorkerDied as e:
            self.replace_worker(str(e))
        else:
            self.publish(done)

    def fail_step(self, e: Exception) -> None:
        """The planned step could not be built: abandon it and fail the requests in it
        with an error reply (their aborts are logged); every other request runs on."""
        out = self.engine.last_schedule
        self.engine.abandon()
        suspects = [*out.decode, *(c.id for c in out.prefill)]
        _log(f"step failed ({e!r}): failing request(s) {sorted(set(suspects))}")
        for seq_id in dict.fromkeys(suspects):
            self.drop(seq_id, Rejected(fid=0, code=500, message=f"internal error: {e!r}"))

    def drop(self, seq_id: int, reply: Rejected | None = None) -> None:
        """Abort a request (logged) and forget it; `reply` (its fid filled in here) tells
        the frontend why, when the frontend did not ask for the abort itself."""
        fid = self.fid_of.pop(seq_id, None)
        self.engine.abort(seq_id)
        if fid is not None:
            del self.seq_of[fid]
            if reply is not None:
                reply.fid = fid
                self.send(reply)

    def submit(self, batch) -> None:
        """The step runner's half that hands a step to the worker (core/step_driver.py)."""
        self.worker.send(batch)

    def collect(self, step: int, rows: int) -> StepResult:
        """The worker's result for `step`; WorkerDied if it dies or hangs meanwhile."""
        return self.worker.result(step, rows, self._while_stepping)

    def _while_stepping(self, frontend_readable: bool) -> None:
        self.link.beat()
        if frontend_readable:
            self.collect_inputs()

    def _param_of(self, e: AdmitError, prompt_len: int) -> str | None:
        """The request field a refusal names: a request that cannot fit the KV pool with
        one generated token is the prompt's fault, else max_tokens'."""
        if isinstance(e, NeverFits):
            per_block = self.engine.sched.blocks.block_tokens()
            return "prompt" if -(-(prompt_len + 1) // per_block) > e.total else "max_tokens"
        return e.param

    def publish(self, done: StepCommit) -> None:
        for part in self._prompt_logprobs(done):   # ahead of the tokens, whose delta takes them
            self.send(StepEvents(fids=I32(), tokens=I32(), finished=[], prompt_logprobs=part))
        for fids, floats in embedding_parts(done.embeddings, self.fid_of):   # ahead of finishes
            self.send(StepEvents(fids=I32(), tokens=I32(), finished=[], embed_fids=fids,
                                 embeddings=floats))
        messages, ended = step_messages(done.events, self.fid_of, done.extras, done.finished)
        for seq_id in ended:
            del self.seq_of[self.fid_of.pop(seq_id)]
        for msg in messages:
            self.send(msg)

    def _prompt_logprobs(self, done: StepCommit) -> list[list]:
        """The step's prompt logprobs by fid (read before the step's finishes forget
        their fids), in messages of bounded size (core/prompt_logprobs.py, `parts`)."""
        out = []
        for seq_id, first, entries in done.prompt_logprobs:
            fid = self.fid_of.get(seq_id)
            if fid is not None:
                out.append([fid, first, entries])
        return parts(out)

    def stats(self) -> dict:
        st = self.engine.sched.stats()
        return {"running": st.running, "waiting": st.waiting, "free_blocks": st.free_blocks,
                "total_blocks": st.total_blocks, "steps": st.steps,
                "preemptions": st.preemptions, "finished": st.finished,
                "max_model_len": self.engine.sched.cfg.max_model_len,
                "hidden_size": self.info.hidden_size,
                "model": self.info.model, "tokenizer": self.info.tokenizer, "tp": self.info.tp,
                "threads": self.info.threads,
                "step_ms_total": self.engine.step_ms_total,
                "step_ms_histogram": self.engine.step_times.snapshot(),
                **prefix_stats(self.engine.sched.blocks),
                "draft_tokens": self.engine.sched.draft_tokens,
                "accepted_tokens": self.engine.sched.accepted_tokens,
                "pids": {"core": os.getpid(), "worker": self.worker.pid}}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.abort_all()
        if self.log is not None:
            self.log.close()
        self.link.close()
        self.worker.close()
