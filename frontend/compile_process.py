"""The frontend's compile checks in a process of their own (docs/structured.md, "The compile
budget").

Why a process, not a thread: the check ran on a niced thread of the frontend, and llguidance
lets go of the GIL while it builds, but not for the Python around the build. When the cores
are busy (a worker's threads spin through a step), a niced thread that holds the GIL waits
tens of milliseconds for its next turn on a core, and the frontend's loop, which forwards
everyone's tokens, waits for the GIL behind it: measured beside two busy cores, the loop's
longest wake-up was 77 ms with a niced compile thread, 18 ms with one at niceness 0 and 5 ms
without one. A child process has a GIL of its own, so its low priority delays only itself: it
runs as the scheduler's background (core/thread_nice.py), from before its imports.

A child per compile in flight (the compile thread's, and the tokenizing thread's for a verdict
evicted meanwhile), started by the first compile that needs it (~0.1 s, once: a frontend
that never sees a constraint never starts one). Frames on the child's stdin and stdout
are a 4-byte length and a CompileJob or CompileVerdict (core/ipc/protocol.py). The child
reports its compile's CPU time; `cpu_s` sums it for the calling thread, so that the fair
queue charges a compile to its client (frontend/tokenizing.py). A compile whose CPU time
passes the bound is stopped there (the child killed; the next compile starts another), where
a thread would have run it to its end. A child that dies fails the constraint in hand.
"""
from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

from core.ipc.lifeline import cpu_seconds
from core.ipc.protocol import CompileJob, CompileVerdict, Constraint, decode, encode
from core.thread_nice import make_this_thread_background
from frontend.compile_check import Outcome, compile_once

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.02          # how often a waiting compile's CPU time is read
_LENGTH = struct.Struct("<I")


class CompileChild:
    """One child process and the round trips to it (one thread at a time)."""

    def __init__(self, bound_ms: float):
        self.bound_ms = bound_ms
        self._proc: subprocess.Popen | None = None

    def compile(self, c: Constraint) -> Outcome:
        try:
            proc = self._started()
            began = cpu_seconds(proc.pid)
            write_frame(proc.stdin, encode(CompileJob(c.kind, c.text)))
            frame = self._reply(proc, began)
        except OSError:
            frame = None
        if isinstance(frame, float):   # past the bound: stopped
            return Outcome(None, frame * 1000, stopped=True)
        if frame is None:
            status = self._end()
            return Outcome(f"the compile check ended on it (exit status {status})", 0.0)
        verdict = decode(frame, accept=(CompileVerdict,))
        return Outcome(verdict.error, verdict.ms)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()   # the child's loop ends at EOF
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._end()
            self._proc = None

    def _started(self) -> subprocess.Popen:
        """The child, started and ready where it was not (its first frame says so: its
        imports' CPU time is not a compile's)."""
        if self._proc is not None and self._proc.poll() is not None:
            self._end()   # gone between compiles (its parent thread's end: die_with_parent)
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "frontend.compile_process"], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
            read_frame(self._proc.stdout)
        return self._proc

    def _reply(self, proc: subprocess.Popen, began: float | None) -> bytes | float | None:
        """The verdict's frame; the CPU seconds spent when stopped past the bound; None when
        the child ended."""
        fd = proc.stdout.fileno()
        while not select.select([fd], [], [], POLL_S)[0]:
            now = cpu_seconds(proc.pid)
            if began is not None and now is not None and now - began > self.bound_ms / 1000:
                self._end()
                return now - began
        return read_frame(proc.stdout)

    def _end(self) -> int | None:
        """Kill the child (if it still runs) and forget it; its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        proc.kill()
        status = proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        return status


class CompileChildren:
    """Children for the threads that compile: each compile takes a free one (a new one when
    none is). `cpu_s` is the calling thread's compiles' CPU time."""

    def __init__(self, bound_ms: float):
        self.bound_ms = bound_ms
        self._mine = threading.local()
        self._lock = threading.Lock()
        self._all: list[CompileChild] = []
        self._free: list[CompileChild] = []

    def compile(self, c: Constraint) -> Outcome:
        with self._lock:
            if not self._free:
                self._all.append(CompileChild(self.bound_ms))
                self._free.append(self._all[-1])
            child = self._free.pop()
        try:
            outcome = child.compile(c)
        finally:
            with self._lock:
                self._free.append(child)
        self._mine.cpu_s = self.cpu_s() + outcome.ms / 1000
        return outcome

    def cpu_s(self) -> float:
        return getattr(self._mine, "cpu_s", 0.0)

    def close(self) -> None:
        with self._lock:
            for child in self._all:
                child.close()


def write_frame(out: BinaryIO, frame: bytes) -> None:
    out.write(_LENGTH.pack(len(frame)) + frame)
    out.flush()


def read_frame(inp: BinaryIO) -> bytes | None:
    """One frame; None at EOF."""
    head = _read_exactly(inp, _LENGTH.size)
    return None if head is None else _read_exactly(inp, _LENGTH.unpack(head)[0])


def _read_exactly(inp: BinaryIO, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        part = inp.read(left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def main() -> None:
    """The child: a verdict for each job on stdin until EOF. Its stdout is the frames' alone
    (fd 1 goes to stderr, so a stray print cannot break a frame)."""
    make_this_thread_background()   # first: its imports are background work too
    from core.ipc.lifeline import die_with_parent
    from worker.grammar_text import byte_tokenizer
    die_with_parent()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    tokenizer = byte_tokenizer()
    write_frame(out, encode(CompileVerdict(None, 0.0)))   # ready
    while (frame := read_frame(inp)) is not None:
        job = decode(frame, accept=(CompileJob,))
        o = compile_once(Constraint(job.kind, job.text), tokenizer, time.thread_time)
        write_frame(out, encode(CompileVerdict(o.error, o.ms)))


if __name__ == "__main__":
    main()
