"""The frontend process loop: clients on a ROUTER, the core on a PUSH/PULL pair.

It validates and tokenizes Generate requests, forwards them to the core as AddRequest,
and turns the core's StepEvents into per-request Deltas (detokenization, EOS, stop
strings). It blocks on its sockets; the poll timeout is the next heartbeat or deadline.
Every ~1 s it pings each client with unfinished requests; a send that fails means the
client is gone, and its requests are aborted at the core.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import zmq

from core.ipc.channel import Channel, Router, RouterError
from core.ipc.lifeline import pid_alive
from core.ipc.protocol import (DEFAULT_MAX_FRAME_BYTES, Abort, AbortRequest, AddRequest,
                           CoreReady, CoreStats, Delta, Drain, ErrorReply, Generate, Hello, I32,
                           ModelInfo, Ping, Pong, ProtocolError, Rejected, SamplingParams,
                           Stats, StatsQuery, StatsReply, StepEvents, StopRequest)
from frontend.events import group_events
from frontend.inflight import Inflight
from frontend.request import RequestState
from frontend.salvage import peek_request_id
from frontend.tokenizer import Tokenizer
from frontend.validate import InvalidRequest, check_params, check_prompt_ids
from frontend.wakeup import Wakeup

log = logging.getLogger("frontend")

DEFAULT_ADDRESS = "tcp://127.0.0.1:7600"
HEARTBEAT_S = 1.0
CORE_CHECK_S = 0.25          # how often the core's pid is checked (503s within 2 s of its death)
PUMP_S = 0.002              # time on one socket before looking at the other (fairness:
                            # a fast core must not keep new clients waiting for many steps)
CLOSE_LINGER_MS = 1000      # let final deltas and aborts leave before the sockets close
CLIENT_TYPES = (Generate, Abort, Stats, Ping)
CORE_TYPES = (CoreReady, Rejected, StepEvents, CoreStats)


@dataclass
class FrontendConfig:
    core_in: str
    core_out: str
    address: str = DEFAULT_ADDRESS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    drain_timeout: float = 30.0
    max_inflight_per_client: int = 1024


class Frontend:
    def __init__(self, cfg: FrontendConfig):
        self.cfg = cfg
        self._ctx = zmq.Context()
        self.router = Router(self._ctx, cfg.address, accept=CLIENT_TYPES,
                             max_bytes=cfg.max_frame_bytes)
        # Unbounded: the frontend never blocks on the core nor drops a frame to it; the
        # per-client cap and the core's queue bound what can pile up.
        self.core_in = Channel(self._ctx, zmq.PUSH, cfg.core_in, bind=False, unbounded=True)
        self.core_out = Channel(self._ctx, zmq.PULL, cfg.core_out, bind=False,
                                accept=CORE_TYPES, unbounded=True,
                                max_bytes=max(cfg.max_frame_bytes, DEFAULT_MAX_FRAME_BYTES))
        self.wakeup = Wakeup()
        self.info: ModelInfo | None = None
        self.tokenizer: Tokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._pids: dict[str, int] = {}   # core and worker, from CoreReady
        self.inflight = Inflight()
        self._next_fid = 0
        self._next_qid = 0
        self._stats_waiters: dict[int, bytes] = {}
        self._stop_signals = 0
        self._drain_deadline: float | None = None
        self._exit_code: int | None = None
        self.core_dead = False

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Signal-handler safe: the loop drains on the first call, hurries on the next."""
        self._stop_signals += 1

    def run(self) -> int:
        self._to_core(Hello(os.getpid()))  # queued until the core's socket is there
        Tokenizer.preload()  # imports transformers while the core is still starting
        poller = zmq.Poller()
        poller.register(self.core_out.sock, zmq.POLLIN)
        poller.register(self.router.sock, zmq.POLLIN)
        poller.register(self.wakeup.read_fd(), zmq.POLLIN)
        next_beat = time.monotonic() + HEARTBEAT_S
        next_check = time.monotonic() + CORE_CHECK_S
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + HEARTBEAT_S
            if now >= next_check:
                self._check_core()
                next_check = now + CORE_CHECK_S
            self._check_drain(now)
            if self._exit_code is not None:
                return self._exit_code
            ready = dict(poller.poll(self._poll_ms(min(next_beat, next_check))))
            if self.core_out.sock in ready:
                self._pump(self.core_out.recv, self._on_core)
            if self.router.sock in ready:
                self._pump(self.router.recv, self._on_client_frame)
            if self.wakeup.read_fd() in ready:
                self.wakeup.clear()

    def close(self) -> None:
        for ch in (self.router, self.core_in, self.core_out):
            ch.sock.close(linger=CLOSE_LINGER_MS)  # Channel.close would drop what is queued
        self._ctx.term()
        self.wakeup.close()

    def _poll_ms(self, next_beat: float) -> int:
        due = next_beat if self._drain_deadline is None else min(next_beat, self._drain_deadline)
        return max(0, int((due - time.monotonic()) * 1000) + 1)

    def _pump(self, recv, handle) -> None:
        """Take messages for up to PUMP_S; a bad one is logged and never stops the loop."""
        until = time.monotonic() + PUMP_S
        while time.monotonic() < until:
            try:
                handle(recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            except RouterError as e:
                self._on_bad_client_frame(e)
            except ProtocolError as e:
                log.warning("dropped a bad frame from the core: %s", e)
            except Exception:
                log.exception("error while handling a message")

    # ------------------------------------------------------------ drain

    def _check_drain(self, now: float) -> None:
        if self._stop_signals and self._drain_deadline is None:
            log.info("draining: %d request(s) in flight", len(self.inflight))
            self._drain_deadline = now + self.cfg.drain_timeout
            if self.info is not None:
                self._to_core(Drain())
        if self._drain_deadline is None:
            return
        if self._stop_signals > 1:
            self._drain_deadline = min(self._drain_deadline, now)
        if not len(self.inflight) or now >= self._drain_deadline:
            for st in self.inflight:
                self._abort(st, tell_client=True)
            self._exit_code = 0

    # ------------------------------------------------------------ clients

    def _on_client_frame(self, item) -> None:
        ident, msg = item
        if isinstance(msg, Generate):
            self._on_generate(ident, msg)
        elif isinstance(msg, Abort):
            st = self.inflight.by_key(ident, msg.request_id)
            if st is not None:
                self._abort(st, tell_client=True)
        elif isinstance(msg, Stats):
            self._on_stats(ident)
        elif isinstance(msg, Ping):
            self.router.send(ident, Pong())

    def _on_bad_client_frame(self, e: RouterError) -> None:
        request_id = peek_request_id(e.frame)
        log.warning("bad frame from client %s (request %r): %s",
                    e.ident.hex(), request_id, e.error)
        self.router.send(e.ident, ErrorReply(request_id, e.error.code, e.error.message))

    def _on_generate(self, ident: bytes, msg: Generate) -> None:
        if self.core_dead:
            return self._error(ident, msg.request_id, 503, "the engine's core process died")
        if self.info is None or self.tokenizer is None:
            return self._error(ident, msg.request_id, 503, "engine not ready")
        if self._drain_deadline is not None:
            return self._error(ident, msg.request_id, 503, "shutting down")
        if self.inflight.by_key(ident, msg.request_id) is not None:
            return self._error(ident, msg.request_id, 400,
                               f"duplicate request_id {msg.request_id!r}")
        cap = self.cfg.max_inflight_per_client
        if self.inflight.count_of(ident) >= cap:
            return self._error(ident, msg.request_id, 429,
                               f"this client already has {cap} requests in flight "
                               "(--max-inflight-per-client)")
        try:
            check_params(msg, self.info)
            ids = (self.tokenizer.encode(msg.prompt, msg.add_special_tokens)
                   if isinstance(msg.prompt, str) else msg.prompt)
            check_prompt_ids(ids, self.info)
        except InvalidRequest as e:
            return self._error(ident, msg.request_id, e.code, str(e))
        st = self._state(ident, msg, ids)
        add = AddRequest(st.fid, msg.request_id, I32(ids), msg.max_tokens, msg.priority,
                         sampling_of(msg), msg.ignore_eos, msg.user)
        if not self._to_core(add):
            return self._error(ident, msg.request_id, 503, "the core is not accepting requests")
        self.inflight.add(st)

    def _state(self, ident: bytes, msg: Generate, ids) -> RequestState:
        stop_ids = frozenset(msg.stop_token_ids or ())
        if not msg.ignore_eos:
            stop_ids |= self._eos_ids
        fid, self._next_fid = self._next_fid, self._next_fid + 1
        return RequestState(ident, msg.request_id, fid, list(ids),
                            self.tokenizer.decoder(msg.skip_special_tokens),
                            list(msg.stop or ()), stop_ids, msg.include_stop_str_in_output,
                            msg.min_tokens)

    def _on_stats(self, ident: bytes) -> None:
        if self.info is None or self.core_dead:
            return self._error(ident, None, 503, "engine not ready")
        qid, self._next_qid = self._next_qid, self._next_qid + 1
        if self._to_core(StatsQuery(qid)):
            self._stats_waiters[qid] = ident
        else:
            self._error(ident, None, 503, "the core is not answering")

    def _error(self, ident: bytes, request_id: str | None, code: int, message: str) -> None:
        self.router.send(ident, ErrorReply(request_id, code, message))

    def _send_delta(self, ident: bytes, delta: Delta) -> None:
        if not self.router.send(ident, delta):
            self._client_gone(ident)

    def _heartbeat(self) -> None:
        for ident in self.inflight.clients():
            if not self.router.send(ident, Pong()):
                self._client_gone(ident)

    def _client_gone(self, ident: bytes) -> None:
        gone = self.inflight.of_client(ident)
        if gone:
            log.info("client %s is gone: aborting %d request(s)", ident.hex(), len(gone))
        for st in gone:
            self._abort(st, tell_client=False)

    def _abort(self, st: RequestState, *, tell_client: bool) -> None:
        self.inflight.remove(st)
        self._to_core(AbortRequest(st.fid))
        if tell_client:
            self.router.send(st.ident, st.end("abort"))

    # ------------------------------------------------------------ core

    def _check_core(self) -> None:
        """A dead core fails every request in flight with 503, and every new one."""
        pid = self._pids.get("core")
        if self.core_dead or pid is None or pid_alive(pid):
            return
        self.core_dead = True
        log.error("the core (pid %d) died: failing %d request(s) with 503", pid,
                  len(self.inflight))
        for st in list(self.inflight):
            self.inflight.remove(st)
            self._error(st.ident, st.request_id, 503, "the engine's core process died")
        for qid, ident in self._stats_waiters.items():
            self._error(ident, None, 503, "the engine's core process died")
        self._stats_waiters.clear()

    def _to_core(self, msg) -> bool:
        if self.core_in.try_send(msg):
            return True
        log.error("no core connected to take %s", type(msg).__name__)
        return False

    def _on_core(self, msg) -> None:
        if isinstance(msg, StepEvents):
            self._on_events(msg)
        elif isinstance(msg, Rejected):
            st = self.inflight.by_fid(msg.fid)
            if st is not None:
                self.inflight.remove(st)
                self._error(st.ident, st.request_id, msg.code, msg.message)
        elif isinstance(msg, CoreStats):
            self._on_core_stats(msg)
        elif isinstance(msg, CoreReady):
            self._on_ready(msg)

    def _on_events(self, ev: StepEvents) -> None:
        for rev in group_events(ev):
            st = self.inflight.by_fid(rev.fid)
            if st is None:
                continue  # finished or aborted here already
            if st.stopping and rev.reason is None:
                continue  # tokens past a stop string, before the core took the stop
            out = st.step(rev)
            if out.done:
                self.inflight.remove(st)
            if out.stop_core is not None:
                self._to_core(StopRequest(rev.fid, out.stop_core))
            self._send_delta(st.ident, out.delta)

    def _on_core_stats(self, msg: CoreStats) -> None:
        ident = self._stats_waiters.pop(msg.qid, None)
        if ident is None:
            return
        stats = dict(msg.stats)
        stats.setdefault("max_model_len", self.info.max_model_len)
        core_pids = stats.get("pids") if isinstance(stats.get("pids"), dict) else {}
        stats["pids"] = {**self._pids, **core_pids, "frontend": os.getpid()}
        self.router.send(ident, StatsReply(stats))

    def _on_ready(self, msg: CoreReady) -> None:
        self._pids.update(core=msg.pid, worker=msg.worker_pid)
        first = self.info is None
        self.info, self._eos_ids = msg.info, frozenset(msg.info.eos_ids)
        if not first:
            log.info("the core is ready again (worker pid %d)", msg.worker_pid)
            return
        try:
            self.tokenizer = Tokenizer.load(msg.info.tokenizer)
        except Exception as e:
            log.error("cannot load the tokenizer %r: %s", msg.info.tokenizer, e)
            self._exit_code = 1
            return
        print(f"READY {self.router.address}", flush=True)


def sampling_of(msg: Generate) -> SamplingParams:
    return SamplingParams(msg.temperature, msg.top_p, msg.top_k, msg.seed, msg.min_p,
                          msg.presence_penalty, msg.frequency_penalty, msg.repetition_penalty,
                          msg.min_tokens, msg.stop_token_ids, msg.logprobs)
