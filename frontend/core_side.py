"""CoreSide: the frontend's link to its engine replicas, and the table of what runs on them.

It owns the replicas (local ones and those that join: frontend/joins.py), the in-flight
table (frontend/inflight.py) with the fid and epoch counters, and the stats queries. It
sends requests to the least loaded replica, turns what each core says (step events,
rejections, stats answers, CoreReady) into replies to clients (frontend/replies.py), and
handles a replica's death: its requests run again on a live one. The Frontend
(frontend/process.py) routes core frames here and admits, aborts and drains through it.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import zmq

from core.ipc.protocol import (AbortRequest, Beat, CoreReady, CoreStats, Drain, Hello,
                               JoinRefused, ModelInfo, Rejected, StepEvents, StopRequest)
from frontend.delta_frames import DeltaFrames
from frontend.events import group_events
from frontend.inflight import Inflight
from frontend.joins import Joins
from frontend.replica_stats import StatsQueries
from frontend.replicas import LocalReplica, Replica, least_loaded, same_model
from frontend.replies import Replies
from frontend.request import RequestState

log = logging.getLogger("frontend")

CORE_DIED = "the engine's core process died"


class CoreSide:
    def __init__(self, replicas: list[Replica], joins: Joins | None, poller: zmq.Poller,
                 replies: Replies, on_model: Callable[[ModelInfo], None],
                 explain_refusals: bool):
        """`on_model(info)`: once every local replica is ready, the first time.
        `explain_refusals`: a refused joiner hears why (only where CURVE authenticated it)."""
        self._replicas = replicas
        self.inflight = Inflight()   # read it; change it through admit, abort and the cores
        self.info: ModelInfo | None = None   # the model, once every local replica is ready
        self._joins, self._poller, self._replies = joins, poller, replies
        self._on_model, self._explain_refusals = on_model, explain_refusals
        self._stats_queries = StatsQueries(CORE_DIED)
        self._next_fid = 0      # one counter for every replica: a fid names one request
        self._next_epoch = 1    # Hello's epochs (core/ipc/protocol.py); local replicas start at 0

    # ------------------------------------------------------------ the loop's side

    @property
    def dead(self) -> bool:
        """Every replica's core died (and none is back yet)."""
        return self.info is not None and not any(r.up for r in self._replicas)

    def start(self) -> None:
        """Hello to each local core (queued until its socket is there); its sockets polled."""
        for r in self._replicas:
            r.send(Hello(os.getpid(), r.epoch))
            self._poller.register(r.core_out.sock, zmq.POLLIN)
        if self._joins is not None:
            self._poller.register(self._joins.router.sock, zmq.POLLIN)

    def sources(self) -> Iterator[tuple[zmq.Socket, Callable, Callable]]:
        """(socket, recv, handle) of each socket the cores speak on, local replicas first."""
        for r in self._replicas:
            if isinstance(r, LocalReplica):
                yield r.core_out.sock, r.core_out.recv, lambda msg, r=r: self.on_core(r, msg)
        if self._joins is not None:
            yield self._joins.router.sock, self._joins.recv, self.on_join_frame

    def close(self, linger: int) -> None:
        for r in self._replicas:
            if isinstance(r, LocalReplica):
                r.close(linger=linger)
        if self._joins is not None:
            self._joins.close(linger=linger)

    def new_fid(self) -> int:
        fid, self._next_fid = self._next_fid, self._next_fid + 1
        return fid

    def admit(self, st: RequestState) -> bool:
        """Send `st.add` to the least loaded replica and hold it in flight; False: no
        replica took it."""
        if not self._dispatch(st):
            return False
        self.inflight.add(st)
        return True

    def abort(self, st: RequestState, *, tell_client: bool) -> None:
        self._remove(st)
        self._replica_of(st).send(AbortRequest(st.fid))
        if tell_client:
            self._replies.aborted(st.ident, st.end("abort"))

    def drain(self) -> None:
        for r in self._replicas:
            if r.up:
                r.send(Drain())

    def ask_stats(self, ident: bytes) -> bool:
        """A Stats query to every live replica; False: none answers."""
        return self._stats_queries.ask(ident, self._replicas)

    def greet_waiting_cores(self) -> None:
        """Hello again, every heartbeat, to each local core not yet ready: its CoreReady is
        dropped if it answers before our PULL has connected to its PUSH (the Hello travels
        the other socket). A core answers a repeated Hello from us with CoreReady alone."""
        for r in self._replicas:
            if isinstance(r, LocalReplica) and not r.up:
                r.send(Hello(os.getpid(), r.epoch))

    def check_cores(self) -> None:
        for r in self._replicas:
            if r.died():
                self._replica_died(r)

    # ------------------------------------------------------------ requests on replicas

    def _dispatch(self, st: RequestState) -> bool:
        """Send it to the replica with the least outstanding work."""
        r = least_loaded(self._replicas)
        if r is None or not r.send(st.add):
            return False
        st.replica = r.index
        r.load += st.outstanding()
        return True

    def _remove(self, st: RequestState) -> None:
        self.inflight.remove(st)
        r = self._replica_of(st)
        r.load = max(0, r.load - st.outstanding())

    def _replica_of(self, st: RequestState) -> Replica:
        return self._replicas[st.replica]

    def _mine(self, r: Replica, fid: int) -> RequestState | None:
        """The request `fid` if it runs on `r` (a re-sent one may hear from its old core)."""
        st = self.inflight.by_fid(fid)
        return st if st is not None and st.replica == r.index else None

    def _new_epoch(self) -> int:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return epoch

    # ------------------------------------------------------------ deaths

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
                self._poller.unregister(r.core_out.sock)
                r.reopen()
                self._poller.register(r.core_out.sock, zmq.POLLIN)
            r.epoch = self._new_epoch()
            r.send(Hello(os.getpid(), r.epoch))
        else:
            self._joins.forget(r)
        for st in mine:
            self._rerun(st)
        for ident, reply in self._stats_queries.replica_gone(r.index):
            self._replies.send(ident, reply)

    def _rerun(self, st: RequestState) -> None:
        if st.stopping:  # its text is complete; only the core's figures are lost
            self.inflight.remove(st)
            return self._replies.delta(st.ident, st.end("stop"))
        st.rerun()
        if not self._dispatch(st):
            self.inflight.remove(st)
            self._replies.error(st.ident, st.request_id, 503, CORE_DIED)

    # ------------------------------------------------------------ what the cores say

    def on_core(self, r: Replica, msg) -> None:
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
                self._replies.error(st.ident, st.request_id, msg.code, msg.message, msg.param)
        elif isinstance(msg, CoreStats):
            answered = self._stats_queries.answer(r, msg)
            if answered is not None:
                self._replies.send(*answered)

    def on_join_frame(self, item) -> None:
        ident, msg = item
        r = self._joins.known(ident)
        if r is not None:
            if self._joins.left(msg):
                r.left()
                self.check_cores()
            else:
                self.on_core(r, msg)
        elif isinstance(msg, Beat):
            self._joins.greet(ident, os.getpid(), self._new_epoch)
        elif isinstance(msg, CoreReady) and self._joins.answers_greeting(ident, msg):
            self._join(ident, msg)

    def _join(self, ident: bytes, msg: CoreReady) -> None:
        why = None if self.info is None else same_model(self.info, msg.info)
        if why is not None:
            log.error("refused the replica of core pid %d: %s", msg.pid, why)
            # the reason names what this frontend serves: only an authenticated peer hears it
            self._joins.router.send(ident, JoinRefused(why if self._explain_refusals
                                                       else "refused"))
            return
        r = self._joins.add(ident, len(self._replicas), msg.epoch)
        self._replicas.append(r)
        log.info("replica %d joined (core pid %d, worker pid %d)", r.index, msg.pid,
                 msg.worker_pid)
        self._on_ready(r, msg)

    def _on_events(self, r: Replica, ev: StepEvents) -> None:
        """Each request's delta of the step, in one Deltas frame per client (frontend/
        delta_frames.py), sent back to back (one wake-up of zmq's I/O thread for them all)
        before this returns, so nothing the loop sends next overtakes them."""
        frames = DeltaFrames(self._replies.encode)
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
            self._replies.deltas(frames.take())

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
        if not all(rep.up for rep in self._replicas if not rep.joined):
            return   # READY once every local replica runs
        self.info = msg.info
        self._on_model(msg.info)
