"""A constraint's compile check, bounded in time and remembered by key
(docs/structured.md, "The compile bound").

The check builds llguidance's whole matcher over a vocabulary of bytes (worker/grammar_text.py
`check`): the parser build a worker does when the constraint first reaches it, in a step.
llguidance's fuel and the size limit (MAX_CONSTRAINT_CHARS) bound that work, but not its
time: a schema of a few kilobytes (`allOf` over `anyOf`s) passes every fuel limit and takes
a second. A compile that took longer than `bound_ms` is refused, so no constraint slower
than the bound to build reaches a worker's step.

Where the compile runs is the caller's `run`: the frontend's runs in a child process
(compile_process.py), which counts the compile's CPU time, so a busy machine does not make a
constraint "too slow", and stops the compile once that time passes the bound. By default it
runs on the calling thread, timed by `clock` (the gateway's: wall time); llguidance cannot be
interrupted and a thread cannot be killed, so there the compile runs to its end (llguidance
lets go of the GIL while it works) and the refusal comes when it has.

Verdicts are kept by the constraint's key (the `size` most recently used): a repeated
constraint is not compiled again, a slow one included. Threads may share one: the verdicts
are read and written under a lock (not held while compiling; two threads may then compile
one new key, and both verdicts agree).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from core.ipc.protocol import Constraint

# 1 s: the benchmark's 64 schemas compile in 1-10 ms and the largest ordinary schemas under
# MAX_CONSTRAINT_CHARS (900 bounded integers, 5,000 enum strings) in 0.02-0.5 s on the 2-core
# machine; what a worker's step may stall once per new constraint stays under a second.
DEFAULT_MAX_COMPILE_MS = 1000
MAX_VERDICTS = 1024


@dataclass(frozen=True)
class Outcome:
    """A compile as it ran: why it does not compile (None: it does, or it was stopped), its
    time in ms, and whether it was stopped at the bound unfinished."""
    error: str | None
    ms: float
    stopped: bool = False


@dataclass(frozen=True)
class Verdict:
    error: str | None      # None: it compiles within the bound
    ms: float              # how long its compile took


class CompileCheck:
    def __init__(self, bound_ms: int = DEFAULT_MAX_COMPILE_MS, size: int = MAX_VERDICTS,
                 clock: Callable[[], float] = time.monotonic,
                 run: Callable[[Constraint], Outcome] | None = None):
        """`run`: where a compile runs (the frontend's: compile_process.py); by default on
        the calling thread, timed by `clock`."""
        self.bound_ms, self.size, self.clock = bound_ms, size, clock
        self._run = run or self._run_here
        self.compiles = 0      # compiles run (a cached verdict is not one)
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._lock = threading.Lock()
        self._tokenizer = None

    def cached(self, c: Constraint) -> bool:
        """Whether `c`'s verdict is kept (error() then compiles nothing)."""
        with self._lock:
            return c.key in self._verdicts

    def error(self, c: Constraint) -> str | None:
        """Why `c` is refused (it does not compile, or not within the bound), or None."""
        with self._lock:
            v = self._verdicts.get(c.key)
            if v is not None:
                self._verdicts.move_to_end(c.key)
                return v.error
        v = self._compile(c)
        with self._lock:
            self._verdicts[c.key] = v
            self._verdicts.move_to_end(c.key)
            while len(self._verdicts) > self.size:
                self._verdicts.popitem(last=False)
        return v.error

    def _compile(self, c: Constraint) -> Verdict:
        self.compiles += 1
        o = self._run(c)
        if o.error is not None:
            error = f"the {c.kind} constraint does not compile: {o.error}"
        elif o.stopped or o.ms > self.bound_ms:
            took = f"over {self.bound_ms} ms (stopped at {o.ms:.0f})" if o.stopped else f"{o.ms:.0f} ms"
            error = (f"the {c.kind} constraint took {took} to compile, over the bound of "
                     f"{self.bound_ms} ms (--max-compile-ms)")
        else:
            error = None
        return Verdict(error, o.ms)

    def _run_here(self, c: Constraint) -> Outcome:
        from worker.grammar_text import byte_tokenizer
        if self._tokenizer is None:
            self._tokenizer = byte_tokenizer()
        return compile_once(c, self._tokenizer, self.clock)


def compile_once(c: Constraint, tokenizer, clock: Callable[[], float]) -> Outcome:
    """One compile of `c` over `tokenizer` (worker/grammar_text.py byte_tokenizer), timed by
    `clock`: on the calling thread (CompileCheck's default) or in the compile process."""
    from worker.grammar_text import BadConstraint, check
    start = clock()
    try:
        check(c, tokenizer)
        error = None
    except BadConstraint as e:
        error = str(e)
    return Outcome(error, (clock() - start) * 1000)
