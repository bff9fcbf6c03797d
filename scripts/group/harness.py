"""Start and stop a real process group (scripts/serve): for tests, the demo and benchmarks."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from scripts import ROOT

# The variable that tags a group's processes (Group.pids)
TAG_VARIABLE = "TL_TEST_GROUP"


@dataclass
class Group:
    proc: subprocess.Popen
    address: str
    log: Path | None
    stderr: Path
    http: str | None = None    # the gateway's base URL when started with --http-port
    # in every process of the group's environment (TAG_VARIABLE): how pids() finds them,
    # orphans included
    tag: str = ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        """Stop serve (it stops its children); returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def pids(self) -> list[int]:
        """Every live process of the group but serve itself: each carries the group's tag in
        its environment, a child that outlived serve (reparented) included."""
        found, marker = [], f"{TAG_VARIABLE}={self.tag}".encode()
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
                environ = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in environ and int(d) != self.proc.pid and state != "Z":
                found.append(int(d))
        return found

    def pid_of(self, needle: str) -> int:
        """The pid of the group's process whose command line contains `needle`."""
        for pid in self.pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmd:
                return pid
        raise LookupError(f"no process of the group runs {needle!r}")

    def logs(self) -> list[Path]:
        """Every step log the group wrote: `log` itself, or with --dp each replica's
        (log.r{k}.db), and after a restart of a replica's core log[.r{k}].{n}.db."""
        if self.log is None:
            return []
        mine = re.compile(rf"{re.escape(self.log.stem)}(\.r\d+)?(\.\d+)?{re.escape(self.log.suffix)}")
        replicas = sorted(p for p in self.log.parent.iterdir() if mine.fullmatch(p.name))
        return replicas or [self.log]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-n:])


def start_group(tmp: Path, args: list[str] = (), timeout: float = 180.0,
                log: bool | Path = True, env: dict | None = None) -> Group:
    """scripts/serve on a free loopback port; waits for its `ready ADDRESS` line.

    `log`: True for tmp/steps.db, a path, or False for --no-log. serve's stderr goes to
    tmp/serve.stderr. `env`: variables added to the group's environment.
    """
    logfile = (tmp / "steps.db" if log is True else Path(log)) if log else None
    err = tmp / "serve.stderr"
    cmd = [sys.executable, "-m", "scripts.group.supervisor", "--startup-timeout",
           str(timeout), "--address", "tcp://127.0.0.1:0",
           *(["--log", str(logfile)] if log else ["--no-log"]), *args]
    tag = uuid.uuid4().hex
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT), **{TAG_VARIABLE: tag})
    # The caller's session, not one of its own: Linux's autogroup puts each session in a
    # scheduling group of its own, which gets as much CPU as the caller's whatever either
    # runs; a test client beside a busy group then waited up to 52 ms for a core (perf
    # sched; docs/structured.md, "Built before the step"). Its own process group keeps
    # a terminal's Ctrl-C to the caller.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err.open("w"), env=env,
                            text=True, process_group=0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ready "):
            http = proc.stdout.readline().split()[1] if "--http-port" in args else None
            return Group(proc, line.split()[-1], logfile, err, http, tag)  # ready [joined] ADDR
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    raise RuntimeError(f"group did not start: {err.read_text()[-3000:]}")
