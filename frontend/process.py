"""The frontend process: clients on a ROUTER, each engine replica's core on a PUSH/PULL pair
(frontend/replicas.py; one replica unless scripts/serve --dp).

It validates and tokenizes Generate requests, forwards them to the core as AddRequest,
and turns the core's StepEvents into per-request Deltas (detokenization, EOS, stop
strings). A request goes to the replica with the least outstanding work and stays there,
unless that replica's core dies: then it runs again on a live one. It blocks on its
sockets; the poll timeout is the next heartbeat or deadline.
Every ~1 s it pings each client with unfinished requests; a send that fails means the
client is gone, and its requests are aborted at the core.

Frontend (this file) owns the loop, the drain and what clients send, and composes three
parts, each with its own state: CoreSide (frontend/core_side.py: the replicas, the
in-flight table, what the cores say), Prompts (frontend/prompts.py: the tokenizer, the
checks against the model, the tokenizing queue) and Replies (frontend/replies.py: what
goes back to clients, and which clients are gone).
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

import zmq

from core.ipc.channel import Router, RouterError, peer_label
from core.ipc.curve import CLIENT_DOMAIN, REPLICA_DOMAIN
from core.ipc.protocol import (DEFAULT_ADDRESS, DEFAULT_MAX_FRAME_BYTES, Abort, AddRequest,
                               Generate, I32, ModelInfo, Ping, Pong, ProtocolError, Stats)
from core.ipc.wire import peek_request_id
from frontend.cache_salt import salt_digest
from frontend.caller import identity
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS
from frontend.constraint_budget import DEFAULT_NEW_CONSTRAINTS_PER_S
from frontend.core_side import CORE_DIED, CoreSide
from frontend.joins import Joins
from frontend.operator import NOT_OPERATOR, OperatorRule
from frontend.prompts import Prompts
from frontend.replicas import LocalReplica, Replica
from frontend.replies import Replies
from frontend.sampling import failover_seed, sampling_of
from frontend.silence import AwakeClock, Silence
from frontend.validate import InvalidField
from frontend.wakeup import Wakeup
from frontend.zap import Curve

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


class Frontend:
    """The loop, and what comes from clients. The cores' side is a CoreSide
    (frontend/core_side.py), the prompts' a Prompts (frontend/prompts.py), both answering
    clients through the Replies (frontend/replies.py) whose gone clients come back here."""

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
        replicas: list[Replica] = [
            LocalReplica(self._ctx, k, core_in, core_out, cfg.max_frame_bytes,
                         Silence(self.clock) if self.several else None)
            for k, (core_in, core_out) in enumerate(cfg.cores)]
        joins = (None if cfg.replica_address is None else
                 Joins(self._ctx, cfg.replica_address, cfg.max_frame_bytes, self.clock,
                       self.curve.options(REPLICA_DOMAIN)))
        if joins is not None:
            self.curve.watch(joins.router.sock)
        self.poller = zmq.Poller()
        self.wakeup = Wakeup()
        self.replies = Replies(self.router, self._client_gone)
        self.cores = CoreSide(replicas, joins, self.poller, self.replies, self._on_model,
                              explain_refusals=self.curve.keys is not None)
        self.prompts = Prompts(cfg.max_compile_ms, cfg.new_constraints_per_s,
                               self.wakeup.poke, self.replies)
        self._stop_signals = 0
        self._drain_deadline: float | None = None
        self._exit_code: int | None = None

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Signal-handler safe: the loop drains on the first call, hurries on the next."""
        self._stop_signals += 1

    def run(self) -> int:
        self.curve.begin()
        self.cores.start()
        self.prompts.preload()   # imports transformers while the cores are still starting
        poller = self.poller
        poller.register(self.router.sock, zmq.POLLIN)
        poller.register(self.wakeup.read_fd(), zmq.POLLIN)
        next_beat = time.monotonic() + HEARTBEAT_S
        next_check = time.monotonic() + CORE_CHECK_S
        while True:
            self.clock.tick()
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + HEARTBEAT_S
            if now >= next_check:
                self.cores.check_cores()
                next_check = now + CORE_CHECK_S
            self._check_drain(now)
            if self._exit_code is not None:
                return self._exit_code
            ready = dict(poller.poll(self._poll_ms(min(next_beat, next_check))))
            for sock, recv, handle in self.cores.sources():
                if sock in ready:
                    self._pump(recv, handle)
            if self.router.sock in ready:
                self._pump(self.router.recv, self._on_client_frame)
            if self.wakeup.read_fd() in ready:
                self.wakeup.clear()
            self._on_tokenized()   # after clear: a result that comes later pokes again

    def close(self) -> None:
        self.prompts.close()
        self.router.sock.close(linger=CLOSE_LINGER_MS)  # Channel.close would drop what is queued
        self.cores.close(linger=CLOSE_LINGER_MS)
        self.curve.close()
        self._ctx.term()
        self.wakeup.close()

    def _on_model(self, info: ModelInfo) -> None:
        """Every local replica is ready: the tokenizer loaded, then READY (or exit 1)."""
        try:
            self.prompts.load(info)
        except Exception as e:
            log.error("cannot load the tokenizer %r: %s", info.tokenizer, e)
            self._exit_code = 1
            return
        # What exists now lives as long as the process (transformers, the tokenizer: ~3e5
        # objects): out of the collector's sight, its full passes no longer walk them all.
        # At 1,024 running, those passes were half the frontend's work on a delta.
        gc.freeze()
        print(f"READY {self.router.address}", flush=True)

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
        inflight = self.cores.inflight
        if self._stop_signals and self._drain_deadline is None:
            log.info("draining: %d request(s) in flight", len(inflight))
            self._drain_deadline = now + self.cfg.drain_timeout
            self.cores.drain()
        if self._drain_deadline is None:
            return
        if self._stop_signals > 1:
            self._drain_deadline = min(self._drain_deadline, now)
        if not (len(inflight) or len(self.prompts)) or now >= self._drain_deadline:
            for st in inflight:
                self.cores.abort(st, tell_client=True)
            self.prompts.abort_all()
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
            st = self.cores.inflight.by_key(ident, msg.request_id)
            if st is not None:
                self.cores.abort(st, tell_client=True)
            else:
                self.prompts.abort(ident, msg.request_id)
        elif isinstance(msg, Stats):
            self._on_stats(ident)
        elif isinstance(msg, Ping):
            self.replies.send(ident, Pong())

    def _on_bad_client_frame(self, e: RouterError) -> None:
        request_id = peek_request_id(e.frame)
        log.warning("bad frame from client %s (request %r): %s",
                    peer_label(e.ident), request_id, e.error)
        self.replies.error(e.ident, request_id, e.error.code, e.error.message)

    def _on_unreadable_generate(self, ident: bytes, msg: Generate, e: Exception) -> None:
        """A Generate whose checks raised what they do not name (a value no check foresaw):
        the client still gets its 400, and the log one line, not a traceback per frame."""
        log.warning("refused request %r: its values raised %s: %.200s",
                    msg.request_id, type(e).__name__, e)
        self.replies.error(ident, msg.request_id, 400,
                           f"the request's values could not be read ({type(e).__name__})")

    def _on_generate(self, ident: bytes, msg: Generate) -> None:
        error = self.replies.error
        if self.cores.dead:
            return error(ident, msg.request_id, 503, CORE_DIED)
        if self.cores.info is None or not self.prompts.ready:
            return error(ident, msg.request_id, 503, "engine not ready")
        if self._drain_deadline is not None:
            return error(ident, msg.request_id, 503, "shutting down")
        inflight = self.cores.inflight
        if (inflight.by_key(ident, msg.request_id) is not None
                or self.prompts.has(ident, msg.request_id)):
            return error(ident, msg.request_id, 400, f"duplicate request_id {msg.request_id!r}")
        cap = self.cfg.max_inflight_per_client
        if inflight.count_of(ident) + self.prompts.count_of(ident) >= cap:
            return error(ident, msg.request_id, 429,
                         f"this client already has {cap} requests in flight "
                         "(--max-inflight-per-client)")
        try:
            self.prompts.check_params(msg)
            # who sent it, while the router still holds this message's frame (its User-Id)
            salt = salt_digest(msg, self.cfg.prefix_cache_scope,
                               identity(msg, self.router.last_frame, self.cfg.group_secret))
            ids = self.prompts.prepare(ident, msg, salt)
        except InvalidField as e:
            return error(ident, msg.request_id, e.code, str(e), e.field)
        if ids is not None:   # else queued: admitted by _on_tokenized
            self._admit(ident, msg, ids, salt)

    def _on_tokenized(self) -> None:
        """Admit every prompt the tokenizing thread has finished (or refuse it: the cores
        died meanwhile). Accepted before a drain began: in flight, as the drain lets finish."""
        for job in self.prompts.done():
            if self.cores.dead:
                self.replies.error(job.ident, job.msg.request_id, 503, CORE_DIED)
            else:
                self._admit(job.ident, job.msg, job.ids, job.salt)

    def _admit(self, ident: bytes, msg: Generate, ids, salt: str | None) -> None:
        """`salt`: the digest of its salts (frontend/cache_salt.py), taken on arrival."""
        st = self.prompts.state(ident, msg, ids, self.cores.new_fid())
        seed = failover_seed(msg, ident) if self.several else None
        st.add = AddRequest(st.fid, msg.request_id, I32(ids), msg.max_tokens, msg.priority,
                            sampling_of(msg, seed), msg.ignore_eos, msg.user,
                            msg.key_hash, salt, msg.embed)
        if not self.cores.admit(st):
            self.replies.error(ident, msg.request_id, 503, "the core is not accepting requests")

    def _on_stats(self, ident: bytes) -> None:
        if not self.operator.allows(self.router.last_frame):
            return self.replies.error(ident, None, 403, NOT_OPERATOR)
        if self.cores.info is None or self.cores.dead:
            return self.replies.error(ident, None, 503, "engine not ready")
        if not self.cores.ask_stats(ident):
            self.replies.error(ident, None, 503, "the core is not answering")

    def _heartbeat(self) -> None:
        for ident in self.cores.inflight.clients():
            self.replies.ping(ident)
        self.cores.greet_waiting_cores()

    def _client_gone(self, ident: bytes) -> None:
        self.prompts.drop(ident)
        gone = self.cores.inflight.of_client(ident)
        if gone:
            log.info("client %s is gone: aborting %d request(s)", peer_label(ident),
                     len(gone))
        for st in gone:
            self.cores.abort(st, tell_client=False)
