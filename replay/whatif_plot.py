"""`scripts/replay whatif --plot FILE`: the predicted timeline beside the recorded one, in
seconds: one lane per request, waiting (arrival to admission) and running (admission to its
last token), and the sequences in each step below."""
from __future__ import annotations

from replay.runmetrics import request_times
from replay.timeline import Step


def plot_whatif(runs: list[tuple[str, list[Step], dict[int, float]]], out: str) -> None:
    """runs: (title, steps, arrival of each request in seconds), one column each."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'tl-engine[plot]'") from None
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 8), sharex=True,
                             sharey="row", squeeze=False,
                             gridspec_kw={"height_ratios": [4, 1]})
    for col, (name, steps, arrivals) in enumerate(runs):
        lanes, batch = axes[0][col], axes[1][col]
        for lane, (seq_id, t) in enumerate(sorted(request_times(steps, arrivals).items())):
            if t.admitted is not None:
                lanes.broken_barh([(t.arrival, t.admitted - t.arrival)], (lane - 0.4, 0.8),
                                  color="#d9d9d9", linewidth=0)
            if t.last is not None:
                lanes.broken_barh([(t.admitted, t.last - t.admitted)], (lane - 0.4, 0.8),
                                  color="#3b7dd8", linewidth=0)
        lanes.set_title(f"{name}: waiting (grey), running (blue)")
        lanes.set_ylabel("request")
        batch.step([s.start for s in steps], [len(s.decode) + len(s.prefill) for s in steps],
                   where="post", color="#6a4c93")
        batch.set_ylabel("sequences")
        batch.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
