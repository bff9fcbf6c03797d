"""A timeline picture of a step log: one lane per request, KV use and batch size below."""
from __future__ import annotations

from replay.logfile import LogFile

COLORS = {"waiting": "#d9d9d9", "running": "#3b7dd8", "preempted": "#e4572e"}


def lanes(log: LogFile) -> dict[int, list[tuple[int, int, str]]]:
    """Per request, (start_step, end_step, state) segments: waiting / running / preempted."""
    state: dict[int, tuple[str, int]] = {seq_id: ("waiting", r["arrival_step"])
                                          for seq_id, r in log.requests.items()}
    segs: dict[int, list] = {seq_id: [] for seq_id in log.requests}

    def move(seq_id: int, new: str, step: int) -> None:
        old, since = state.get(seq_id, ("waiting", step))
        if old != new:
            segs.setdefault(seq_id, []).append((since, step, old))
            state[seq_id] = (new, step)

    for row in log.steps():
        for seq_id, start, _, _ in row.schedule["prefill"]:
            if start == 0:
                move(seq_id, "running", row.step)
        for seq_id in row.schedule["preempted"]:
            move(seq_id, "preempted", row.step)
    for seq_id, r in log.requests.items():
        end = r["finish_step"] if r["finish_step"] is not None else log.num_steps()
        old, since = state[seq_id]
        segs[seq_id].append((since, end, old))
    return segs


def plot(log: LogFile, out: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot needs matplotlib: pip install 'tl-engine[plot]'") from None
    rows = list(log.steps())
    fig, (ax, kv, bt) = plt.subplots(3, 1, figsize=(12, 8), sharex=True,
                                     gridspec_kw={"height_ratios": [4, 1, 1]})
    for lane, (seq_id, segs) in enumerate(sorted(lanes(log).items())):
        for start, end, st in segs:
            ax.broken_barh([(start, max(end - start, 0.5))], (lane - 0.4, 0.8),
                           color=COLORS[st], linewidth=0)
    ax.set_ylabel("request")
    ax.set_title(f"{log.path}: waiting (grey), running (blue), preempted (red)")
    steps = [r.step for r in rows]
    kv.plot(steps, [log.meta["num_blocks"] - r.free_blocks for r in rows], color="#2a9d8f")
    kv.set_ylabel("KV blocks")
    bt.plot(steps, [len(r.schedule["decode"]) + sum(c[2] for c in r.schedule["prefill"])
                    for r in rows], color="#6a4c93")
    bt.set_ylabel("batch tokens")
    bt.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
