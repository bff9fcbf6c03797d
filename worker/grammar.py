"""Constrained rows in the worker (docs/structured.md): one llguidance matcher per sequence,
brought to the tokens the batch says the row has generated, and the masks of a step's
constrained rows applied to their logits before sampling and logprobs.

The batch is the truth: a matcher is kept between steps only as a cache. Each step it is
checked against the row's generated tokens (grammar_tokens) and advanced by the new ones, or
rebuilt from all of them when they disagree (a preempted request recomputed, a stale batch, a
new worker), so preemption, restarts, overlap and replay need nothing else.

A key's grammar is built off the step path where the core asks for it first (PrepareGrammar,
worker/grammar_builds.py's thread; docs/structured.md, "Built before the step"): the core holds
the request until the worker says it is built, so a step finds it built. A step builds one
itself only where nobody asked first (replay's runner, an engine without a core); a step
that needs a key still building (just after a restart) waits for that build.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from core.ipc.protocol import Constraint, ForwardBatch

log = logging.getLogger("worker")

MAX_GRAMMARS = 1024   # built grammars kept by key, least recently used dropped
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass
class _Seq:
    key: str
    matcher: object                # llguidance.LLMatcher
    tokens: list[int]              # the generated tokens it has consumed


class Grammars:
    def __init__(self, tokenizer_dir: str, vocab_size: int, eos_ids: list[int]):
        self.tokenizer_dir, self.vocab_size, self.eos_ids = tokenizer_dir, vocab_size, eos_ids
        self._tok = None           # llguidance.LLTokenizer, built at the first constraint
        self._executor = None
        # key -> pristine matcher; the builder thread installs into it, so under _lock
        self._built: OrderedDict[str, object] = OrderedDict()
        # key -> a copy of its pristine matcher whose first mask the builder thread computed:
        # the first sequence under the key takes it (a copy's first mask explores the
        # grammar's lexer states, ~30-100 ms for an allOf/anyOf schema, and a deep_copy does
        # not share them: warmed here, that cost is off the shared step too)
        self._spares: dict[str, object] = {}
        self._building: dict[str, threading.Event] = {}   # keys the builder thread is on
        self._lock = threading.Lock()
        self._tok_lock = threading.Lock()
        self._seqs: dict[int, _Seq] = {}
        self.spent_s = 0.0         # seconds in mask() so far: builds, syncs, masks (benchmarks)

    def mask(self, logits: torch.Tensor, b: ForwardBatch) -> torch.Tensor:
        """`logits` [R, V] with every token the constrained rows' grammars forbid at -inf
        (nothing else changes: the batch-invariant mode stays bitwise); a new tensor when
        any row is constrained, `logits` itself when none is."""
        if not b.grammar:
            return logits
        t0 = time.perf_counter()
        try:
            return self._masked(logits, b)
        finally:
            self.spent_s += time.perf_counter() - t0

    def _masked(self, logits: torch.Tensor, b: ForwardBatch) -> torch.Tensor:
        self._learn(b.grammar_specs)
        rows = [j for j, key in enumerate(b.grammar) if key]
        seqs = [int(b.seq_ids[b.sample_rows[j]]) for j in rows]
        matchers = [self._sync(s, b, j) for s, j in zip(seqs, rows)]
        self._seqs = {s: self._seqs[s] for s in seqs}   # a sequence not sampled now is rebuilt
        allowed = self._allowed(matchers)
        out = logits.clone()
        index = torch.tensor(rows, device=logits.device)
        out[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))
        return out

    # ---- matchers

    def _learn(self, specs: list[list[str]]) -> None:
        for key, kind, text in specs:
            with self._lock:
                if key in self._built:
                    self._built.move_to_end(key)
                    continue
                building = self._building.get(key)
            if building is not None:
                building.wait()   # only a restarted worker's recompute gets here
            if not self.holds(key):
                self.install(key, self.build(Constraint(kind, text)))

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._built

    def has_spare(self, key: str) -> bool:
        """Whether `key`'s warmed copy waits for its first sequence."""
        with self._lock:
            return key in self._spares

    def begin(self, key: str) -> bool:
        """Whether `key` needs a build (the caller then builds and installs it): False when
        it is built or being built."""
        with self._lock:
            if key in self._built or key in self._building:
                return False
            self._building[key] = threading.Event()
            return True

    def abandon(self, key: str) -> None:
        """`key`'s build failed off the step: a step that needs it builds it itself."""
        with self._lock:
            done = self._building.pop(key, None)
        if done is not None:
            done.set()

    def install(self, key: str, matcher, spare=None) -> None:
        """`key`'s pristine matcher, built (on any thread), and a warmed copy of it for its
        first sequence (warmed()) or None; the least recently used past MAX_GRAMMARS are
        dropped."""
        with self._lock:
            self._built[key] = matcher
            self._built.move_to_end(key)
            if spare is not None:
                self._spares[key] = spare
            while len(self._built) > MAX_GRAMMARS:
                self._spares.pop(self._built.popitem(last=False)[0], None)
            done = self._building.pop(key, None)
        if done is not None:
            done.set()

    def build(self, c: Constraint):
        """`c`'s pristine matcher, as this worker builds a new key's (scripts/bench
        structured times it); each sequence gets a deep_copy of it."""
        import llguidance

        from worker.grammar_text import grammar_of
        m = llguidance.LLMatcher(self._tokenizer(), grammar_of(c), log_level=0)
        if m.is_error():   # the frontend checked it: only what needs the vocabulary fails here
            log.warning("constraint %s does not compile: %s", c.key, m.get_error())
        return m

    @staticmethod
    def warmed(matcher):
        """A copy of pristine `matcher` that has computed its first mask (llguidance lets go
        of the GIL meanwhile), or None where `matcher` failed to compile."""
        if matcher.is_error():
            return None
        spare = matcher.deep_copy()
        spare.compute_bitmask()   # computes, consumes nothing: the copy stays pristine
        return spare

    def _fresh(self, key: str):
        """A pristine matcher of `key` for a new sequence: its warmed spare where one is
        left, else a copy of the pristine one."""
        with self._lock:
            spare = self._spares.pop(key, None)
            built = self._built.get(key)
        if spare is not None:
            return spare
        if built is None:
            return None
        return built.deep_copy()

    def _sync(self, seq_id: int, b: ForwardBatch, j: int):
        """Row j's matcher, having consumed exactly the row's generated tokens."""
        key = b.grammar[j]
        tokens = b.grammar_tokens[b.grammar_start[j]:b.grammar_start[j + 1]].tolist()
        st = self._seqs.get(seq_id)
        if st is None or st.key != key or st.tokens != tokens[:len(st.tokens)]:
            fresh = self._fresh(key)
            if fresh is None:
                raise ValueError(f"row {j} has constraint {key}, which this worker was never "
                                 "given (its spec comes with the request's first sample)")
            st = _Seq(key, fresh, [])
            self._seqs[seq_id] = st
        new = tokens[len(st.tokens):]
        if new:
            st.matcher.consume_tokens(new)
            st.tokens.extend(new)
        return st.matcher

    # ---- masks

    def _allowed(self, matchers: list) -> torch.Tensor:
        """[len(matchers), vocab] bool: what each may take next. A matcher in an error state
        (a token it refused: only a stale batch's zeros can be one) may take EOS only, so
        its request ends."""
        import llguidance
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros((len(matchers), words), dtype=torch.int32)
        self._executor = self._executor or llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)],
                                               bitmask.data_ptr(), words * 4, len(matchers))
        allowed = ((bitmask[:, :, None] >> _BITS) & 1).view(len(matchers), -1)
        allowed = allowed[:, :self.vocab_size].bool()
        dead = ~allowed.any(-1)
        if bool(dead.any()):
            allowed[dead.nonzero().flatten()[:, None], torch.tensor(self.eos_ids)] = True
        return allowed

    def _tokenizer(self):
        with self._tok_lock:   # the builder thread's build and a step's may both come here
            return self._make_tokenizer()

    def _make_tokenizer(self):
        if self._tok is None:
            import llguidance.hf
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(self.tokenizer_dir)
            self._tok = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab_size,
                                                     eos_token=list(self.eos_ids) or None)
        return self._tok
