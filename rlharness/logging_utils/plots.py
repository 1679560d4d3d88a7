"""`plots/*.png` from `metrics.jsonl`: the curves a person looks at first."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir

# file name -> (title, [metric keys]) ; a plot is written only if one of its keys exists.
# `*` stands for a task name: a multi-task run gets one curve per task.
PLOTS = {
    "reward": ("Rollout reward", ["rollout/reward_mean", "rollout/*/reward_mean"]),
    "eval_accuracy": ("Eval accuracy (greedy pass@1)", ["eval/accuracy", "eval/*/accuracy", "eval/pass@k"]),
    "response_len": ("Response length (tokens)", ["rollout/response_len_mean", "rollout/*/response_len_mean"]),
    "throughput": ("Throughput (tokens/s)", ["perf/tokens_per_s"]),
    "staleness": ("Staleness (weight versions)", ["staleness/mean", "staleness/max", "staleness/admission_mean",
                                                  "staleness/admission_max", "staleness/*/max"]),
    "loss": ("Training loss", ["train/loss", "train/kl"]),
    "step_time": ("Time per step (s)", ["perf/step_s", "perf/rollout_s", "perf/train_s", "perf/weight_sync_s"]),
}


def write_plots(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(RunDir(run_dir).metrics)
    out_dir = RunDir(run_dir).plots
    out_dir.mkdir(exist_ok=True)
    written = []
    present = list(dict.fromkeys(k for r in rows for k in r))
    for name, (title, patterns) in PLOTS.items():
        keys = [k for p in patterns for k in (fnmatch.filter(present, p) if "*" in p else [p])]
        series = {k: [(r["step"], r[k]) for r in rows if r.get(k) is not None] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig, ax = _figure(plt)
        for key, pts in series.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    hist = staleness_histogram(rows)
    if hist:
        fig, ax = _figure(plt)
        total = sum(hist.values())
        ax.bar(list(hist), [n / total for n in hist.values()])
        ax.set_title("Per-token staleness of trained tokens (whole run)")
        ax.set_xlabel("staleness (weight versions)")
        ax.set_ylabel("share of trained tokens")
        ax.set_xticks(list(hist))
        ax.grid(alpha=0.3, axis="y")
        path = out_dir / "staleness_hist.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _figure(plt):
    # Fixed margins that fit these plots' labels: `tight_layout` measured them again for each
    # figure (1.2 s of drawing per run instead of 0.7 s).
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.14, top=0.91)
    return fig, ax


HIST_PREFIX = "staleness/tokens_at_"


def staleness_histogram(rows: list[dict]) -> dict[int, float]:
    """Trained tokens per staleness over the run, from the steps' `staleness/tokens_at_<k>` counts."""
    hist: dict[int, float] = {}
    for r in rows:
        for key, value in r.items():
            if key.startswith(HIST_PREFIX) and value is not None:
                k = int(key[len(HIST_PREFIX):])
                hist[k] = hist.get(k, 0.0) + float(value)
    return dict(sorted(hist.items()))
