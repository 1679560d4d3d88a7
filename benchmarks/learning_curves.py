"""Learning curves of headline runs, from their run directories, into one CSV (and a table).

    python train.py hydra.run.dir=outputs/curves/default
    python train.py strategy=async max_staleness=1 hydra.run.dir=outputs/curves/async1
    python train.py experiment=chat_tools hydra.run.dir=outputs/curves/chat_tools
    python benchmarks/learning_curves.py default=outputs/curves/default async1=outputs/curves/async1 \
        chat_tools=outputs/curves/chat_tools

writes `benchmarks/results/learning_curves.csv` (one row per run and step: elapsed seconds of steps
and evals, the step's mean training reward, and the greedy eval accuracy on eval steps) and prints
each run's eval accuracy by step with its wall time (from `train.log`'s first and last timestamps).
`python scripts/make_doc_figures.py` draws `docs/img/learning_curves.png` from the CSV.
"""

from __future__ import annotations

import argparse
import csv
import re
from datetime import datetime
from pathlib import Path

from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "learning_curves.csv"
FIELDS = ["run", "step", "elapsed_s", "reward_mean", "eval_accuracy"]
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")


def curve(name: str, run_dir: Path) -> list[dict]:
    """One row per step of the run's metrics.jsonl."""
    rows, elapsed = [], 0.0
    for r in read_metrics(RunDir(run_dir).metrics):
        elapsed += r.get("perf/step_s", 0.0) + r.get("perf/eval_s", 0.0)
        rows.append({"run": name, "step": r["step"], "elapsed_s": round(elapsed, 2),
                     "reward_mean": _round(r.get("rollout/reward_mean")),
                     "eval_accuracy": _round(r.get("eval/accuracy"))})
    return rows


def _round(v: float | None) -> float | str:
    return "" if v is None else round(v, 4)


def wall_s(run_dir: Path) -> float | None:
    """Seconds between the first and the last timestamped line of train.log (start-up to the last save)."""
    stamps = [STAMP.match(line) for line in RunDir(run_dir).log().read_text().splitlines()]
    times = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") for m in stamps if m]
    return (times[-1] - times[0]).total_seconds() if len(times) > 1 else None


def table(name: str, rows: list[dict], wall: float | None) -> str:
    evals = [r for r in rows if r["eval_accuracy"] != ""]
    cells = " | ".join(f"{r['step']}: {100 * r['eval_accuracy']:.1f}%" for r in evals)
    minutes = f"{int(wall // 60)}m{int(wall % 60):02d}s" if wall else "?"
    return f"| {name} | {cells} | {minutes} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = []
    for spec in args.runs:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"{spec!r}: expected NAME=RUN_DIR")
        run_rows = curve(name, Path(path))
        if not run_rows:
            parser.error(f"{path}: no metrics.jsonl rows")
        rows += run_rows
        print(table(name, run_rows, wall_s(Path(path))))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
