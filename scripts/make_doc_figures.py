"""Draw the documentation's pictures from the committed results (no run needed).

    python scripts/make_doc_figures.py              # writes docs/img/*.png
    python scripts/make_doc_figures.py --out DIR    # elsewhere (what the test does)

- learning_curves.png: greedy eval accuracy and training reward of the headline runs, from
  benchmarks/results/learning_curves.csv (benchmarks/learning_curves.py);
- producer_efficiency.png: the producer's throughput as a share of the ideal bound X*, and the
  ceiling the staleness rule leaves any producer, from benchmarks/results/producer_efficiency.csv
  and benchmarks/results/admission/producer_efficiency.csv (benchmarks/producer_efficiency.py);
- colocate_disagg.png: three steps of a colocated and a disaggregated run on a time axis, with the
  phase lengths measured by benchmarks/disagg_vs_colocate.py (PHASES_S below).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DPI = 100

# Headline runs in the order drawn, with the label the docs use: the default task's runs share two
# panels (400 steps), the chat model's run (30 steps) has its own.
ARITH_RUNS = {"default": "python train.py", "async1": "strategy=async max_staleness=1"}
CHAT_RUN = ("chat_tools", "experiment=chat_tools")

# The producer benchmark's modes drawn, in order: (label, csv, mode). Token-rule rows from the full
# run, admission rows from the admission run (benchmarks/results/admission/).
PRODUCER_MODES = [
    ("sync", "producer_efficiency.csv", "sync"),
    ("async s=1", "producer_efficiency.csv", "async s=1"),
    ("async s=2", "producer_efficiency.csv", "async s=2"),
    ("async s=1\npartial", "producer_efficiency.csv", "async s=1 partial"),
    ("async s=2\npartial", "producer_efficiency.csv", "async s=2 partial"),
    ("async s=4\npartial", "producer_efficiency.csv", "async s=4 partial"),
    ("admission\ns=2 partial", "admission/producer_efficiency.csv", "admission s=2 partial"),
    ("admission\ns=4 partial", "admission/producer_efficiency.csv", "admission s=4 partial"),
]
PRODUCER_CASES = [("whole-batch", "1", "whole batch in the engines' slots, length CV 1.0"),
                  ("slot-limited", "1", "slot-limited (4 samples per slot per step), CV 1.0")]

# One step's phases in seconds on the 2-core box, 16 prompts x 8 samples of the tiny model
# (docs/benchmarks.md, "Disaggregated async vs colocated sync"): colocated produces (0.073 s) then
# trains (0.091 s) on both cores and syncs in process (the default run's median perf/weight_sync_s);
# disaggregated trains on one core (the training call, 0.133 s) while the engine actor generates the
# next batch on the other (0.057 s for 128 samples on one thread), then ships the weights (0.008 s).
PHASES_S = {"colocate": {"generate": 0.073, "train": 0.091, "sync": 0.002},
            "disagg": {"generate": 0.057, "train": 0.133, "sync": 0.008}}
COLOURS = {"generate": "#4c72b0", "train": "#dd8452", "sync": "#55a868", "idle": "#dddddd"}


def learning_curves(out: Path) -> Path:
    rows = list(csv.DictReader(open(RESULTS / "learning_curves.csv")))

    def series(run: str, key: str, scale: float = 1.0) -> list[tuple[int, float]]:
        return [(int(r["step"]), scale * float(r[key])) for r in rows if r["run"] == run and r[key]]

    fig, (acc, rew, chat) = plt.subplots(1, 3, figsize=(14, 4), dpi=DPI, gridspec_kw={"width_ratios": [3, 3, 2]})
    for run, label in ARITH_RUNS.items():
        line, = acc.plot(*zip(*series(run, "eval_accuracy", 100)), marker="o", label=label)
        rew.plot(*zip(*_smooth(series(run, "reward_mean"), 10)), color=line.get_color(), label=label)
    acc.set(xlabel="training step", ylabel="greedy eval accuracy (%)",
            title="3-digit addition: held-out accuracy")
    rew.set(xlabel="training step", ylabel="mean reward (10-step mean)", title="3-digit addition: training reward")
    run, label = CHAT_RUN
    chat.plot(*zip(*series(run, "eval_accuracy", 100)), marker="o", color="tab:green", label="eval accuracy (%)")
    chat.plot(*zip(*series(run, "reward_mean", 100)), color="tab:olive", label="training reward (x100)")
    chat.set(xlabel="training step", ylim=(0, 105), title=f"{label} (calculator tool)")
    for ax in (acc, rew, chat):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        ax.title.set_fontsize(11)
    fig.tight_layout()
    return _save(fig, out / "learning_curves.png")


def _smooth(points: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    return [(s, sum(v for _, v in points[max(0, i - k + 1): i + 1]) / len(points[max(0, i - k + 1): i + 1]))
            for i, (s, _) in enumerate(points)]


def producer_efficiency(out: Path) -> Path:
    tables = {name: list(csv.DictReader(open(RESULTS / name))) for name in {m[1] for m in PRODUCER_MODES}}
    fig, axes = plt.subplots(1, len(PRODUCER_CASES), figsize=(12, 4.2), dpi=DPI, sharey=True)
    for ax, (case, cv, title) in zip(axes, PRODUCER_CASES):
        for x, (label, name, mode) in enumerate(PRODUCER_MODES):
            row = next(r for r in tables[name] if r["case"] == case and r["cv"] == cv and r["mode"] == mode)
            share = 100 * float(row["ratio"])
            colour = "#8c8c8c" if mode == "sync" else "#4c72b0" if mode.startswith("async") else "#c44e52"
            ax.bar(x, share, color=colour)
            ax.text(x, share + 1.5, f"{share:.0f}", ha="center", fontsize=8)
            ceiling = float(row["ceiling"])
            if not math.isnan(ceiling):
                top = 100 * min(ceiling / float(row["ideal"]), 1.0)
                ax.plot([x - 0.4, x + 0.4], [top, top], color="black", lw=1.5)
        ax.axhline(100, color="black", ls="--", lw=1)
        ax.set_xticks(range(len(PRODUCER_MODES)), [m[0] for m in PRODUCER_MODES], fontsize=7.5)
        ax.set(title=title, ylim=(0, 112))
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("throughput, % of the ideal bound X*")
    for colour, label in (("#8c8c8c", "sync"), ("#4c72b0", "async, token rule (expiry)"),
                          ("#c44e52", "async, admission rule")):
        axes[0].bar([0], [0], color=colour, label=label)
    axes[0].plot([], [], color="black", lw=1.5, label="ceiling of the staleness rule")
    axes[0].plot([], [], color="black", ls="--", lw=1, label="ideal bound X* (100%)")
    axes[0].legend(fontsize=7.5, loc="upper left")
    fig.suptitle("The real producer on a virtual clock: trained samples/s against the ideal (benchmarks/"
                 "producer_efficiency.py)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out / "producer_efficiency.png")


def colocate_disagg(out: Path, steps: int = 3) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 4.6), dpi=DPI, sharex=True,
                                      gridspec_kw={"height_ratios": [1, 2]})
    p = PHASES_S["colocate"]
    t = 0.0
    for k in range(1, steps + 1):  # one device: generate batch k with weights v=k-1, train it, sync v=k
        _bar(top, 0, t, p["generate"], "generate", f"batch {k}\nv{k - 1}")
        _bar(top, 0, t + p["generate"], p["train"], "train", f"train {k}")
        _bar(top, 0, t + p["generate"] + p["train"], p["sync"], "sync", "")
        t += sum(p.values())
    colocated_end = t
    top.set(yticks=[0], yticklabels=["engine + trainer\n(same devices)"], ylim=(-0.6, 0.6),
            title=f"mode=colocate: rollout and training take turns ({steps} steps, {colocated_end:.2f} s)")
    p = PHASES_S["disagg"]
    # Engines generate batch k+1 on weights v=k-1 while the trainer trains batch k (staleness 1);
    # a sync pauses them for the weights of step k.
    t_train = p["generate"]
    _bar(bottom, 1, 0.0, p["generate"], "generate", "batch 1\nv0")
    for k in range(1, steps + 1):
        _bar(bottom, 0, t_train, p["train"], "train", f"train {k}")
        _bar(bottom, 0, t_train + p["train"], p["sync"], "sync", "")
        _bar(bottom, 1, t_train, p["generate"], "generate", f"batch {k + 1}\nv{k - 1}")
        _bar(bottom, 1, t_train + p["generate"], p["train"] - p["generate"], "idle", "idle")
        _bar(bottom, 1, t_train + p["train"], p["sync"], "sync", "")
        bottom.add_patch(FancyArrowPatch((t_train + p["train"] + p["sync"] / 2, 0.3),
                                         (t_train + p["train"] + p["sync"] / 2, 0.7), arrowstyle="->",
                                         mutation_scale=10, color="black"))
        t_train += p["train"] + p["sync"]
    bottom.set(yticks=[0, 1], yticklabels=["trainer actor", "engine actors"], ylim=(-0.6, 1.6),
               xlabel="seconds (one step's phases as measured on the 2-core CPU box)",
               title=f"mode=disagg: the engines generate the next batch while the trainer trains ({steps} steps, "
                     f"{t_train:.2f} s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in ("generate", "train", "sync")]
    top.legend(handles, ["generate (vN: the weights it samples with)", "train", "weight sync (arrow: to the engines)"],
               fontsize=8, loc="upper right", ncol=3)
    for ax in (top, bottom):
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out / "colocate_disagg.png")


def _bar(ax, y: float, start: float, width: float, kind: str, label: str) -> None:
    ax.barh(y, width, left=start, height=0.6, color=COLOURS[kind], edgecolor="white")
    if label:
        ax.text(start + width / 2, y, label, ha="center", va="center", fontsize=7.5,
                color="#555555" if kind == "idle" else "white")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


FIGURES = (learning_curves, producer_efficiency, colocate_disagg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    for draw in FIGURES:
        print(f"wrote {draw(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
