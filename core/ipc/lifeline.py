"""Children of scripts/serve die with it (PR_SET_PDEATHSIG), and SIGTERM ends them cleanly."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from contextlib import contextmanager
from typing import NoReturn

PR_SET_PDEATHSIG = 1
# A child's exit status for "start me again": not a fault, serve does not count it as a
# restart (a tensor-parallel rank on another machine that found no rank 0 to meet, worker/tp.py).
REJOIN = 75


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` when the parent exits (Linux); exit if it already did."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        except OSError:
            pass
    if os.getppid() == 1:
        os._exit(1)


class Interrupts:
    """SIGTERM raises KeyboardInterrupt wherever the process is. `asked` says one came,
    also once the interrupt surfaces wrapped in another error: raised inside a
    torch.library op that a traced graph calls (worker/graph.py), it comes out of the
    graph as a RuntimeError."""

    def __init__(self):
        self.asked = False

    def __call__(self, signum, frame):
        self.asked = True
        raise KeyboardInterrupt

    @contextmanager
    def end_quietly(self):
        """The block ends without a traceback when SIGTERM ended it; other errors go on."""
        try:
            yield
        except KeyboardInterrupt:
            pass
        except Exception:
            if not self.asked:
                raise


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown of its modules: with transformers or torch
    imported that takes about a second on 2 cores, and a group's stop waits for it. The
    caller has already closed what must be closed (sockets, the step log)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def sigterm_as_interrupt() -> Interrupts:
    handler = Interrupts()
    signal.signal(signal.SIGTERM, handler)
    return handler


def parse_cpu_seconds(stat: str, ticks_per_s: int) -> float:
    """utime + stime of a /proc/PID/stat line, in seconds. The command name (field 2) may
    hold spaces and parentheses, so the fields are counted from its last ')'."""
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / ticks_per_s   # fields 14 and 15


def cpu_seconds(pid: int) -> float | None:
    """The CPU time process `pid` has used so far, all its threads; None once it is gone (or
    where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_cpu_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """False once `pid` has exited, also while it is a zombie its parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
