"""python -m replay (scripts/replay): verify, summary, request, diff, plot a step log; whatif and
trace (replay/whatif.py).

Exit codes: 0 success, 1 a divergence (verify) or a difference (diff), 2 a file that is
not a readable, whole step log, 3 the log's model, device or dtype is not available here
(verify --with-model); 2 and 3 print one line on stderr saying why.
"""
from __future__ import annotations

import argparse
import os
import sys

from core import cli
from replay.logfile import DamagedLog, LogFile


def _context(log: LogFile, step: int, around: int = 2) -> str:
    lines = []
    for row in log.steps():
        if abs(row.step - step) <= around:
            mark = ">>" if row.step == step else "  "
            lines.append(f"{mark} step {row.step}: schedule {row.schedule} outputs {row.outputs}")
    return "\n".join(lines)


def cmd_verify(a) -> int:
    from replay.verify import verify
    log = LogFile(a.file)
    for w in log.version_warnings():
        print(f"warning: {w}", file=sys.stderr)
    runner = None
    if a.with_model:
        # the worker's kernels run here; their threads' wait policy is set before torch
        # loads libgomp (worker/threads.py). The short spin whatever the load: a replay
        # mostly runs alone, where PASSIVE took 1.8x as long (smollm2's log: 48 s against
        # 27 s), and beside other replays it lets go of a core within microseconds, where
        # libgomp's default spin held it for a millisecond each time
        from worker.threads import SHORT_SPIN, set_unless_chosen
        if "torch" not in sys.modules:   # else libgomp has read its settings already
            set_unless_chosen(os.environ, SHORT_SPIN)
        from replay.model import ModelUnavailable, runner_for, tp_warning
        log.check_steps()
        if w := tp_warning(log.meta):
            print(f"warning: {w}", file=sys.stderr)
        try:
            runner = runner_for(log.meta, a.device, a.dtype)
        except ModelUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        where = f"{runner.info.device}, {runner.info.dtype}"
        logged = log.meta["model_info"]
        if (a.device or a.dtype) and where != f"{logged.get('device')}, {logged.get('dtype')}":
            print(f"warning: re-running on {where}; the log was made on {logged.get('device')}"
                  f", {logged.get('dtype')}: tokens may differ", file=sys.stderr)
    v = verify(log, runner, progress=True)
    if v.ok:
        print(f"ok: {v.steps} steps verified"
              + (f" with the model on {runner.info.device}, {runner.info.dtype}" if runner else ""))
        return 0
    d = v.divergence
    print(f"DIVERGED at step {d.step} ({d.what}):")
    for line in d.diffs:
        print(f"  {line}")
    print(_context(log, d.step))
    return 1


def cmd_summary(a) -> int:
    from replay.report import summary
    print(summary(LogFile(a.file)))
    return 0


def cmd_request(a) -> int:
    if a.rerun:
        from replay.rerun import main as rerun
        return rerun(LogFile(a.file), a.id, a.device, a.dtype)
    from replay.report import request_life
    print(request_life(LogFile(a.file), a.id))
    return 0


def cmd_diff(a) -> int:
    from replay.diff import first_difference
    d = first_difference(LogFile(a.a), LogFile(a.b))
    if d is None:
        print("no difference")
        return 0
    print(d)
    return 1


def cmd_plot(a) -> int:
    from replay.plot import plot
    plot(LogFile(a.file), a.output)
    print(f"wrote {a.output}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = cli.parser("scripts/replay", __doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    v = cli.command(sub, "verify", "re-run the log; exit 1 at the first divergent step")
    v.add_argument("--with-model", action="store_true", help="re-run the worker too")
    v.add_argument("--device", help="with --with-model: run here (default: the log's device)")
    v.add_argument("--dtype", help="with --with-model: run in this dtype (default: the log's)")
    v.add_argument("file", help="the step log")
    v.set_defaults(fn=cmd_verify)
    s = cli.command(sub, "summary", "requests, steps, tokens, waits, KV use")
    s.add_argument("file", help="the step log")
    s.set_defaults(fn=cmd_summary)
    r = cli.command(sub, "request", "one request's life")
    r.add_argument("file", help="the step log")
    r.add_argument("id", type=int, help="the request's seq_id (Result.metrics['log_id'])")
    r.add_argument("--rerun", action="store_true",
                   help="re-run it alone with the model and compare its tokens (replay/rerun.py)")
    r.add_argument("--device", help="with --rerun: run here (default: the log's device)")
    r.add_argument("--dtype", help="with --rerun: run in this dtype (default: the log's)")
    r.set_defaults(fn=cmd_request)
    d = cli.command(sub, "diff", "the first step where two logs differ")
    d.add_argument("a", help="one step log")
    d.add_argument("b", help="the other")
    d.set_defaults(fn=cmd_diff)
    pl = cli.command(sub, "plot", "a timeline picture (needs matplotlib)")
    pl.add_argument("file", help="the step log")
    pl.add_argument("-o", "--output", required=True, help="the picture file (.png, .svg, ...)")
    pl.set_defaults(fn=cmd_plot)
    from replay.whatif import add_parsers   # whatif and trace (replay/whatif.py)
    add_parsers(sub)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except DamagedLog as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
