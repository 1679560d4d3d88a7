"""`plots/*.png` from `metrics.jsonl`: the curves a person looks at first."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from rlharness.logging_utils.metrics import read_metrics

# file name -> (title, [metric keys]) ; a plot is written only if one of its keys exists.
# `*` stands for a task name: a multi-task run gets one curve per task.
PLOTS = {
    "reward": ("Rollout reward", ["rollout/reward_mean", "rollout/*/reward_mean"]),
    "eval_accuracy": ("Eval accuracy (greedy pass@1)", ["eval/accuracy", "eval/*/accuracy", "eval/pass@k"]),
    "response_len": ("Response length (tokens)", ["rollout/response_len_mean"]),
    "throughput": ("Throughput (tokens/s)", ["perf/tokens_per_s"]),
    "staleness": ("Staleness (weight versions)", ["staleness/mean", "staleness/max"]),
    "loss": ("Training loss", ["train/loss", "train/kl"]),
    "step_time": ("Time per step (s)", ["perf/step_s", "perf/rollout_s", "perf/train_s", "perf/weight_sync_s"]),
}


def write_plots(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    present = list(dict.fromkeys(k for r in rows for k in r))
    for name, (title, patterns) in PLOTS.items():
        keys = [k for p in patterns for k in (fnmatch.filter(present, p) if "*" in p else [p])]
        series = {k: [(r["step"], r[k]) for r in rows if r.get(k) is not None] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for key, pts in series.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
