"""Start and stop a real process group (scripts/serve): for tests, the demo and benchmarks."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from scripts import ROOT



@dataclass
class Group:
    proc: subprocess.Popen
    address: str
    log: Path | None
    stderr: Path
    http: str | None = None    # the gateway's base URL when started with --http-port

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

    def pid_of(self, needle: str) -> int:
        """The pid of the group's process whose command line contains `needle` (serve
        runs in a session of its own, so its children share the session id serve's pid)."""
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat[3]) == self.proc.pid and needle in cmd and int(d) != self.proc.pid:
                return int(d)
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
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err.open("w"), env=env,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ready "):
            http = proc.stdout.readline().split()[1] if "--http-port" in args else None
            return Group(proc, line.split()[-1], logfile, err, http)  # ready [joined] ADDR
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    raise RuntimeError(f"group did not start: {err.read_text()[-3000:]}")
