"""CoreSide: the frontend's half that listens to its engine replicas.

What each core says (step events, rejections, stats answers, CoreReady), replicas that
join from elsewhere, and the death of a replica: its requests run again on a live one. It
is mixed into Frontend (frontend/process.py) and works on that state: `replicas`,
`inflight`, `router`, `poller`, `joins`, `stats_queries`, and the model once ready.
"""
from __future__ import annotations

import gc
import logging
import os

import zmq

from core.ipc.protocol import (Beat, CoreReady, CoreStats, Hello, JoinRefused, Rejected,
                               StepEvents, StopRequest)
from frontend.delta_frames import DeltaFrames
from frontend.events import group_events
from frontend.replicas import LocalReplica, Replica, same_model
from frontend.request import RequestState
from frontend.tokenizer import Tokenizer

log = logging.getLogger("frontend")

CORE_DIED = "the engine's core process died"


class CoreSide:
    def _greet_waiting_cores(self) -> None:
        """Hello again, every heartbeat, to each local core not yet ready: its CoreReady is
        dropped if it answers before our PULL has connected to its PUSH (the Hello travels
        the other socket). A core answers a repeated Hello from us with CoreReady alone."""
        for r in self.replicas:
            if isinstance(r, LocalReplica) and not r.up:
                r.send(Hello(os.getpid(), r.epoch))

    def _check_cores(self) -> None:
        for r in self.replicas:
            if r.died():
                self._replica_died(r)

    def _replica_died(self, r: Replica) -> None:
        """Its requests run again on a live replica; with none left, they get 503. A local
        replica is greeted in a new epoch: its core, restarted by serve or resumed from a
        stop, aborts whatever it held and answers CoreReady, which brings it back. A joined
        one is forgotten (its core, restarted or resumed, joins as a new replica)."""
        mine = [st for st in self.inflight if st.replica == r.index]
        stalled = isinstance(r, LocalReplica) and not r.dead()
        log.error("%s replica %d's core (pid %d) %s: %d request(s) in flight",
                  "joined" if r.joined else "local", r.index, r.pids["core"],
                  f"fell silent ({r.silence.quiet_s():.1f} s: stopped?)" if stalled
                  else "died or left", len(mine))
        if isinstance(r, LocalReplica):
            if not stalled:   # a stopped core keeps its pipe: what it reads next is in order
                self.poller.unregister(r.core_out.sock)
                r.reopen()
                self.poller.register(r.core_out.sock, zmq.POLLIN)
            r.epoch = self._new_epoch()
            r.send(Hello(os.getpid(), r.epoch))
        else:
            self.joins.forget(r)
        for st in mine:
            self._rerun(st)
        for ident, reply in self.stats_queries.replica_gone(r.index):
            self.router.send(ident, reply)

    def _rerun(self, st: RequestState) -> None:
        if st.stopping:  # its text is complete; only the core's figures are lost
            self.inflight.remove(st)
            return self._send_delta(st.ident, st.end("stop"))
        st.rerun()
        if not self._dispatch(st):
            self.inflight.remove(st)
            self._error(st.ident, st.request_id, 503, CORE_DIED)

    def _on_core(self, r: Replica, msg) -> None:
        r.heard()
        if isinstance(msg, CoreReady):
            self._on_ready(r, msg)
        elif not r.up or isinstance(msg, Beat):
            return   # a dropped core's last words: its requests run elsewhere now
        elif isinstance(msg, StepEvents):
            self._on_events(r, msg)
        elif isinstance(msg, Rejected):
            st = self._mine(r, msg.fid)
            if st is not None:
                self._remove(st)
                self._error(st.ident, st.request_id, msg.code, msg.message, msg.param)
        elif isinstance(msg, CoreStats):
            answered = self.stats_queries.answer(r, msg)
            if answered is not None:
                self.router.send(*answered)

    def _on_join_frame(self, item) -> None:
        ident, msg = item
        r = self.joins.known(ident)
        if r is not None:
            if self.joins.left(msg):
                r.left()
                self._check_cores()
            else:
                self._on_core(r, msg)
        elif isinstance(msg, Beat):
            self.joins.greet(ident, os.getpid(), self._new_epoch)
        elif isinstance(msg, CoreReady) and self.joins.answers_greeting(ident, msg):
            self._join(ident, msg)

    def _join(self, ident: bytes, msg: CoreReady) -> None:
        why = None if self.info is None else same_model(self.info, msg.info)
        if why is not None:
            log.error("refused the replica of core pid %d: %s", msg.pid, why)
            # the reason names what this frontend serves: only an authenticated peer hears it
            self.joins.router.send(ident, JoinRefused(why if self.curve.keys else "refused"))
            return
        r = self.joins.add(ident, len(self.replicas), msg.epoch)
        self.replicas.append(r)
        log.info("replica %d joined (core pid %d, worker pid %d)", r.index, msg.pid,
                 msg.worker_pid)
        self._on_ready(r, msg)

    def _mine(self, r: Replica, fid: int) -> RequestState | None:
        """The request `fid` if it runs on `r` (a re-sent one may hear from its old core)."""
        st = self.inflight.by_fid(fid)
        return st if st is not None and st.replica == r.index else None

    def _on_events(self, r: Replica, ev: StepEvents) -> None:
        """Each request's delta of the step, in one Deltas frame per client (frontend/
        delta_frames.py), sent back to back (one wake-up of zmq's I/O thread for them all)
        before this returns, so nothing the loop sends next overtakes them."""
        frames = DeltaFrames(self.router.encode)
        try:
            for rev in group_events(ev):
                st = self._mine(r, rev.fid)
                if st is None:
                    continue  # finished or aborted here already
                if rev.embedding is not None:
                    st.embedded(rev.embedding)
                    if rev.reason is None:
                        continue   # its finish follows in the step's next message
                if rev.prompt:
                    st.prompt_scores(rev.prompt)
                    if not rev.tokens and rev.reason is None:
                        continue   # a prompt chunk's scores: they go with the first delta
                if st.skip:
                    rev = st.skip_rerun(rev)
                    if not rev.tokens and rev.reason is None:
                        continue
                if st.stopping and rev.reason is None:
                    continue  # tokens past a stop string, before the core took the stop
                before = st.outstanding()
                out = st.step(rev)
                r.load = max(0, r.load - (before - st.outstanding()))
                if out.done:
                    self._remove(st)
                if out.stop_core is not None:
                    r.send(StopRequest(rev.fid, out.stop_core))
                frames.add(st.ident, out.delta)
        finally:   # a request that failed mid-message: the deltas made before it still go
            self._send_deltas(frames.take())

    def _on_ready(self, r: Replica, msg: CoreReady) -> None:
        if msg.epoch != r.epoch:
            return   # not the answer to our last Hello: it may still hold older requests
        if r.up and r.pids.get("core") == msg.pid:
            return   # an answer to a repeated Hello, or a new worker
        r.ready(msg)
        if self.info is not None:
            log.info("replica %d's core is ready (core pid %d, worker pid %d)", r.index,
                     msg.pid, msg.worker_pid)
            return
        if not all(rep.up for rep in self.replicas if not rep.joined):
            return   # READY once every local replica runs
        self.info, self._eos_ids = msg.info, frozenset(msg.info.eos_ids)
        try:
            self.tokenizer = Tokenizer.load(msg.info.tokenizer)
        except Exception as e:
            log.error("cannot load the tokenizer %r: %s", msg.info.tokenizer, e)
            self._exit_code = 1
            return
        # What exists now lives as long as the process (transformers, the tokenizer: ~3e5
        # objects): out of the collector's sight, its full passes no longer walk them all.
        # At 1,024 running, those passes were half the frontend's work on a delta.
        gc.freeze()
        print(f"READY {self.router.address}", flush=True)

