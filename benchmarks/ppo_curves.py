"""Eval curves and critic metrics of finished runs, as the markdown rows of docs/benchmarks.md
("Issue 26: PPO with a critic").

    python benchmarks/ppo_curves.py <run dir> [<run dir> ...]

One row per run: greedy eval accuracy at every eval step, then (algo=ppo runs) the critic's
explained variance, value loss and values/returns means averaged over the last 10 steps, and
the mean seconds per step split into rollout and training (shared box: compare within a table).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def summary(run_dir: Path) -> str:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "perf/step_s" in r]
    last = steps[-10:]

    def mean(key: str) -> str:
        vals = [r[key] for r in last if key in r]
        return f"{statistics.fmean(vals):.3f}" if vals else "-"

    curve = " / ".join(f"{100 * acc:.1f}%" for _, acc in evals)
    timing = (f"{statistics.fmean(r['perf/step_s'] for r in steps):.1f} s "
              f"(train {statistics.fmean(r['perf/train_s'] for r in steps):.1f} s)")
    return (f"| {run_dir.name} | {curve} | {mean('rollout/reward_mean')} | {mean('critic/vf_explained_var')} | "
            f"{mean('critic/value_loss')} | {mean('critic/values_mean')} / {mean('critic/returns_mean')} | {timing} |")


if __name__ == "__main__":
    print("| run | eval at " + " / ".join(str(s) for s, _ in
          [(r["step"], 0) for r in map(json.loads, Path(sys.argv[1], "metrics.jsonl").read_text().splitlines())
           if "eval/accuracy" in r]) + " | train reward (last 10) | explained var | value loss | values / returns "
          "mean | per step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for arg in sys.argv[1:]:
        print(summary(Path(arg)))
