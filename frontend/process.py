"""The frontend process loop: clients on a ROUTER, each engine replica's core on a PUSH/PULL
pair (frontend/replicas.py; one replica unless scripts/serve --dp).

It validates and tokenizes Generate requests, forwards them to the core as AddRequest,
and turns the core's StepEvents into per-request Deltas (detokenization, EOS, stop
strings). A request goes to the replica with the least outstanding work and stays there,
unless that replica's core dies: then it runs again on a live one. It blocks on its
sockets; the poll timeout is the next heartbeat or deadline.
Every ~1 s it pings each client with unfinished requests; a send that fails means the
client is gone, and its requests are aborted at the core. This file is the client side;
what the cores say, and a replica's death or join, is frontend/core_side.py.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import zmq

from core.ipc.channel import Router, RouterError, peer_label
from core.ipc.protocol import (DEFAULT_ADDRESS, DEFAULT_MAX_FRAME_BYTES, Abort, AbortRequest,
                               AddRequest, Delta, Deltas, Drain, ErrorReply, Generate, Hello, I32,
                               ModelInfo, Ping, Pong, ProtocolError, Stats)
from core.ipc.wire import peek_request_id
from frontend.cache_salt import salt_digest
from frontend.caller import identity
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS, CompileCheck
from frontend.constraint_budget import DEFAULT_NEW_CONSTRAINTS_PER_S, ConstraintBudget
from core.ipc.curve import CLIENT_DOMAIN, REPLICA_DOMAIN
from frontend.core_side import CORE_DIED, CoreSide
from frontend.zap import Curve
from frontend.operator import NOT_OPERATOR, OperatorRule
from frontend.prompts import PromptSide
from frontend.inflight import Inflight
from frontend.replica_stats import StatsQueries
from frontend.joins import Joins
from frontend.replicas import LocalReplica, Replica, least_loaded
from frontend.request import RequestState
from frontend.sampling import failover_seed, sampling_of
from frontend.silence import AwakeClock, Silence
from frontend.structured import constraint_of
from frontend.token_bound import check_prompt_text
from frontend.tokenizer import Tokenizer
from frontend.tokenizing import TokenizeQueue
from frontend.validate import InvalidField, check_params, check_prompt_ids
from frontend.wakeup import Wakeup

log = logging.getLogger("frontend")

HEARTBEAT_S = 1.0
CORE_CHECK_S = 0.25          # how often the cores' pids are checked (503s within 2 s of a death)
PUMP_S = 0.002              # time on one socket before looking at the other (fairness:
                            # a fast core must not keep new clients waiting for many steps)
CLOSE_LINGER_MS = 1000      # let final deltas and aborts leave before the sockets close
CLIENT_TYPES = (Generate, Abort, Stats, Ping)


@dataclass
class FrontendConfig:
    cores: list[tuple[str, str]]   # each replica's (core_in, core_out)
    address: str = DEFAULT_ADDRESS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    drain_timeout: float = 30.0
    max_inflight_per_client: int = 1024
    replica_address: str | None = None   # where replicas may join (frontend/joins.py)
    max_compile_ms: int = DEFAULT_MAX_COMPILE_MS   # a constraint's compile bound
    prefix_cache_scope: str = "global"   # which salts a request gets (frontend/cache_salt.py)
    curve: str | None = None   # the key directory (core/ipc/curve.py): CURVE on both ROUTERs
    # new constraints a client may have compiled a second (frontend/constraint_budget.py)
    new_constraints_per_s: float = DEFAULT_NEW_CONSTRAINTS_PER_S
    # the group's secret the gateway signs key_hash with (frontend/caller.py); never logged
    group_secret: bytes | None = field(default=None, repr=False)


class Frontend(CoreSide, PromptSide):
    def __init__(self, cfg: FrontendConfig):
        self.cfg = cfg
        self._ctx = zmq.Context()
        self.curve = Curve.open(self._ctx, cfg.curve)
        self.operator = OperatorRule(cfg.curve is not None, cfg.address)
        self.router = Router(self._ctx, cfg.address, accept=CLIENT_TYPES,
                             max_bytes=cfg.max_frame_bytes,
                             options=self.curve.options(CLIENT_DOMAIN),
                             keep_frame=self.operator.needs_frame)
        self.curve.watch(self.router.sock)
        self.clock = AwakeClock()
        # with somewhere to re-run them, a stopped core's requests do not wait for it
        self.several = len(cfg.cores) > 1 or cfg.replica_address is not None
        self.replicas: list[Replica] = [
            LocalReplica(self._ctx, k, core_in, core_out, cfg.max_frame_bytes,
                         Silence(self.clock) if self.several else None)
            for k, (core_in, core_out) in enumerate(cfg.cores)]
        self.joins = (None if cfg.replica_address is None else
                      Joins(self._ctx, cfg.replica_address, cfg.max_frame_bytes, self.clock,
                            self.curve.options(REPLICA_DOMAIN)))
        if self.joins is not None:
            self.curve.watch(self.joins.router.sock)
        self.poller = zmq.Poller()
        self.wakeup = Wakeup()
        self.info: ModelInfo | None = None
        self.tokenizer: Tokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self.inflight = Inflight()
        self.compiles = CompileCheck(cfg.max_compile_ms)   # the tokenizing thread's only
        self.budget = ConstraintBudget(cfg.new_constraints_per_s)   # the thread's only too
        self.tokenizing = TokenizeQueue(self._tokenize, self.wakeup.poke)
        self._next_fid = 0      # one counter for every replica: a fid names one request
        self._next_epoch = 1    # Hello's epochs (core/ipc/protocol.py); local replicas start at 0
        self.stats_queries = StatsQueries(CORE_DIED)
        self._stop_signals = 0
        self._drain_deadline: float | None = None
        self._exit_code: int | None = None

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Signal-handler safe: the loop drains on the first call, hurries on the next."""
        self._stop_signals += 1

    @property
    def core_dead(self) -> bool:
        """Every replica's core died (and none is back yet)."""
        return self.info is not None and not any(r.up for r in self.replicas)

    def run(self) -> int:
        self.curve.begin()
        for r in self.replicas:
            r.send(Hello(os.getpid(), r.epoch))  # queued until the core's socket is there
            self.poller.register(r.core_out.sock, zmq.POLLIN)
        Tokenizer.preload()  # imports transformers while the cores are still starting
        poller = self.poller
        poller.register(self.router.sock, zmq.POLLIN)
        poller.register(self.wakeup.read_fd(), zmq.POLLIN)
        if self.joins is not None:
            poller.register(self.joins.router.sock, zmq.POLLIN)
        next_beat = time.monotonic() + HEARTBEAT_S
        next_check = time.monotonic() + CORE_CHECK_S
        while True:
            self.clock.tick()
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + HEARTBEAT_S
            if now >= next_check:
                self._check_cores()
                next_check = now + CORE_CHECK_S
            self._check_drain(now)
            if self._exit_code is not None:
                return self._exit_code
            ready = dict(poller.poll(self._poll_ms(min(next_beat, next_check))))
            for r in self.replicas:
                if isinstance(r, LocalReplica) and r.core_out.sock in ready:
                    self._pump(r.core_out.recv, lambda msg, r=r: self._on_core(r, msg))
            if self.joins is not None and self.joins.router.sock in ready:
                self._pump(self.joins.recv, self._on_join_frame)
            if self.router.sock in ready:
                self._pump(self.router.recv, self._on_client_frame)
            if self.wakeup.read_fd() in ready:
                self.wakeup.clear()
            self._on_tokenized()   # after clear: a result that comes later pokes again

    def close(self) -> None:
        self.tokenizing.close()
        self.router.sock.close(linger=CLOSE_LINGER_MS)  # Channel.close would drop what is queued
        for r in self.replicas:
            if isinstance(r, LocalReplica):
                r.close(linger=CLOSE_LINGER_MS)
        if self.joins is not None:
            self.joins.close(linger=CLOSE_LINGER_MS)
        self.curve.close()
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
            for r in self.replicas:
                if r.up:
                    r.send(Drain())
        if self._drain_deadline is None:
            return
        if self._stop_signals > 1:
            self._drain_deadline = min(self._drain_deadline, now)
        if not (len(self.inflight) or len(self.tokenizing)) or now >= self._drain_deadline:
            for st in self.inflight:
                self._abort(st, tell_client=True)
            self._abort_pending(self.tokenizing.drop_all())
            self._exit_code = 0

    # ------------------------------------------------------------ clients

    def _on_client_frame(self, item) -> None:
        ident, msg = item
        if isinstance(msg, Generate):
            try:
                self._on_generate(ident, msg)
            except Exception as e:  # noqa: BLE001  every frame gets a reply (see below)
                self._on_unreadable_generate(ident, msg, e)
        elif isinstance(msg, Abort):
            st = self.inflight.by_key(ident, msg.request_id)
            if st is not None:
                self._abort(st, tell_client=True)
            else:
                self._abort_pending([self.tokenizing.cancel(ident, msg.request_id)])
        elif isinstance(msg, Stats):
            self._on_stats(ident)
        elif isinstance(msg, Ping):
            self.router.send(ident, Pong())

    def _on_bad_client_frame(self, e: RouterError) -> None:
        request_id = peek_request_id(e.frame)
        log.warning("bad frame from client %s (request %r): %s",
                    peer_label(e.ident), request_id, e.error)
        self.router.send(e.ident, ErrorReply(request_id, e.error.code, e.error.message))

    def _on_unreadable_generate(self, ident: bytes, msg: Generate, e: Exception) -> None:
        """A Generate whose checks raised what they do not name (a value no check foresaw):
        the client still gets its 400, and the log one line, not a traceback per frame."""
        log.warning("refused request %r: its values raised %s: %.200s",
                    msg.request_id, type(e).__name__, e)
        self._error(ident, msg.request_id, 400,
                    f"the request's values could not be read ({type(e).__name__})")

    def _on_generate(self, ident: bytes, msg: Generate) -> None:
        if self.core_dead:
            return self._error(ident, msg.request_id, 503, CORE_DIED)
        if self.info is None or self.tokenizer is None:
            return self._error(ident, msg.request_id, 503, "engine not ready")
        if self._drain_deadline is not None:
            return self._error(ident, msg.request_id, 503, "shutting down")
        if (self.inflight.by_key(ident, msg.request_id) is not None
                or self.tokenizing.has(ident, msg.request_id)):
            return self._error(ident, msg.request_id, 400,
                               f"duplicate request_id {msg.request_id!r}")
        cap = self.cfg.max_inflight_per_client
        if self.inflight.count_of(ident) + self.tokenizing.count_of(ident) >= cap:
            return self._error(ident, msg.request_id, 429,
                               f"this client already has {cap} requests in flight "
                               "(--max-inflight-per-client)")
        try:
            check_params(msg, self.info)
            # who sent it, while the router still holds this message's frame (its User-Id)
            salt = salt_digest(msg, self.cfg.prefix_cache_scope,
                               identity(msg, self.router.last_frame, self.cfg.group_secret))
            # its shape and size here; compiled off the loop (docs/structured.md)
            constrained = constraint_of(msg.response_format, msg.structured_outputs) is not None
            fit = msg.max_tokens if msg.max_tokens_must_fit else None
            if isinstance(msg.prompt, str):   # tokenized off the loop, then _on_tokenized
                check_prompt_text(self.tokenizer.bound, msg.prompt, self.info.max_model_len, fit)
                return self.tokenizing.submit(ident, msg, salt)
            check_prompt_ids(msg.prompt, self.info, fit)
            if constrained:
                return self.tokenizing.submit(ident, msg, salt)
        except InvalidField as e:
            return self._error(ident, msg.request_id, e.code, str(e), e.field)
        self._admit(ident, msg, msg.prompt, salt)

    def _admit(self, ident: bytes, msg: Generate, ids, salt: str | None) -> None:
        """`salt`: the digest of its salts (frontend/cache_salt.py), taken on arrival."""
        st = self._state(ident, msg, ids)
        seed = failover_seed(msg, ident) if self.several else None
        st.add = AddRequest(st.fid, msg.request_id, I32(ids), msg.max_tokens, msg.priority,
                            sampling_of(msg, seed), msg.ignore_eos, msg.user,
                            msg.key_hash, salt, msg.embed)
        if not self._dispatch(st):
            return self._error(ident, msg.request_id, 503, "the core is not accepting requests")
        self.inflight.add(st)

    def _dispatch(self, st: RequestState) -> bool:
        """Send it to the replica with the least outstanding work."""
        r = least_loaded(self.replicas)
        if r is None or not r.send(st.add):
            return False
        st.replica = r.index
        r.load += st.outstanding()
        return True

    def _new_epoch(self) -> int:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return epoch

    def _state(self, ident: bytes, msg: Generate, ids) -> RequestState:
        stop_ids = frozenset(msg.stop_token_ids or ())
        if not msg.ignore_eos:
            stop_ids |= self._eos_ids
        fid, self._next_fid = self._next_fid, self._next_fid + 1
        return RequestState(ident, msg.request_id, fid, list(ids),
                            self.tokenizer.decoder(msg.skip_special_tokens),
                            list(msg.stop or ()), stop_ids, msg.include_stop_str_in_output,
                            msg.min_tokens, msg.max_tokens,
                            prompt_logprobs=msg.prompt_logprobs is not None,
                            detok=self.tokenizer.detokenizer(msg.skip_special_tokens, ids),
                            embed=msg.embed)

    def _on_stats(self, ident: bytes) -> None:
        if not self.operator.allows(self.router.last_frame):
            return self._error(ident, None, 403, NOT_OPERATOR)
        if self.info is None or self.core_dead:
            return self._error(ident, None, 503, "engine not ready")
        if not self.stats_queries.ask(ident, self.replicas):
            self._error(ident, None, 503, "the core is not answering")

    def _error(self, ident: bytes, request_id: str | None, code: int, message: str,
               param: str | None = None) -> None:
        self.router.send(ident, ErrorReply(request_id, code, message, param))

    def _send_delta(self, ident: bytes, delta: Delta) -> None:
        """One delta, alone in its frame."""
        if not self.router.send(ident, Deltas.of([delta])):
            self._client_gone(ident)

    def _send_deltas(self, frames: list[tuple[bytes, bytes]]) -> None:
        """Send the encoded frames; a client whose send failed is gone."""
        for ident in self.router.send_encoded(frames):
            self._client_gone(ident)

    def _heartbeat(self) -> None:
        for ident in self.inflight.clients():
            if not self.router.send(ident, Pong()):
                self._client_gone(ident)
        self._greet_waiting_cores()

    def _client_gone(self, ident: bytes) -> None:
        self.tokenizing.drop(ident)
        gone = self.inflight.of_client(ident)
        if gone:
            log.info("client %s is gone: aborting %d request(s)", peer_label(ident),
                     len(gone))
        for st in gone:
            self._abort(st, tell_client=False)

    def _abort(self, st: RequestState, *, tell_client: bool) -> None:
        self._remove(st)
        self._replica_of(st).send(AbortRequest(st.fid))
        if tell_client:
            self.router.send(st.ident, Deltas.of([st.end("abort")]))

    def _remove(self, st: RequestState) -> None:
        self.inflight.remove(st)
        r = self._replica_of(st)
        r.load = max(0, r.load - st.outstanding())

    def _replica_of(self, st: RequestState) -> Replica:
        return self.replicas[st.replica]
