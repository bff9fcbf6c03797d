"""Children: the processes scripts/serve runs, by name: start, watch, wait for READY, stop."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time

from scripts import ROOT

# serve's own variables that only the child given them in `env` may see
PRIVATE_ENV = ("TL_API_KEY", "TL_GROUP_SECRET")
STOP_POLL_S = 0.05   # how often a stop looks whether it was hurried


class Children:
    def __init__(self, cmds: dict[str, list[str]], piped: tuple[str, ...] = ("frontend", "http"),
                 env: dict[str, dict[str, str]] | None = None):
        self.cmds, self.piped = cmds, piped   # piped: whose stdout says when it is ready
        # env: variables one child alone gets (the gateway's API keys, never on argv)
        self.env = env or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.hurried = lambda: False   # serve's: a second stop signal skips the grace
        for name in cmds:   # cores and workers, then the frontend
            self.spawn(name)

    def spawn(self, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        env.update(self.env.get(name, {}), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        out = subprocess.PIPE if name in self.piped else None
        # Own process groups: a terminal's Ctrl-C reaches serve alone, which then
        # drains the group in order; PDEATHSIG still ends them if serve dies.
        self.procs[name] = subprocess.Popen(self.cmds[name], env=env, stdout=out, cwd=ROOT,
                                            process_group=0)

    def dead(self, ignore: tuple[str, ...] = ()) -> tuple[str, int] | None:
        for name, p in self.procs.items():
            if name not in ignore and p.poll() is not None:
                return name, p.returncode
        return None

    def wait_ready(self, timeout: float, name: str = "frontend",
                   tolerate: tuple[str, ...] = (), marker: str = "READY ") -> str | None:
        """What `name` prints after `marker` (its bound address) once it prints it; None if
        a process not in `tolerate` died meanwhile."""
        sel = selectors.DefaultSelector()
        out = self.procs[name].stdout
        sel.register(out, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(0.2):
                line = out.readline().decode(errors="replace").strip()
                if line.startswith(marker):
                    threading.Thread(target=self._forward, args=(out,), daemon=True).start()
                    return line.split(" ", 1)[1]
                if line:
                    print(line, flush=True)
            if self.dead(ignore=tolerate):
                return None
        return None

    @staticmethod
    def _forward(out) -> None:
        for line in out:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()

    def terminate(self, names) -> None:
        for name in names:
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def engines(self) -> list[str]:
        return [n for n in self.procs if n.startswith(("core", "worker"))]

    def stop(self, names=None, grace: float = 5.0) -> None:
        """SIGTERM to each of `names`, then SIGKILL to whichever still runs after `grace`
        seconds (or at once when `hurried()` turns true: serve's second SIGTERM/SIGINT), so a
        child ends whatever it is doing: stuck, stopped or ignoring SIGTERM."""
        names = names or ("http", "frontend", *self.engines())
        names = [n for n in names if n in self.procs]
        self.terminate(names)
        deadline = time.monotonic() + grace
        for name in names:
            p = self.procs[name]
            while p.poll() is None and time.monotonic() < deadline and not self.hurried():
                try:
                    p.wait(min(STOP_POLL_S, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
            if p.poll() is None:
                p.kill()
                p.wait()
