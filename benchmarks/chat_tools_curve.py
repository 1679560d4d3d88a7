"""Learning curve of a chat run (`python train.py experiment=chat_tools` / `chat_math` / `code_tools`),
from its run directory: eval accuracy and tool use by step with the elapsed time, the mean step
time, and the first trajectory of the ledger's first and last steps (before and after training);
`--plot FILE.png` draws eval accuracy, tool use and train reward by step.

    python benchmarks/chat_tools_curve.py outputs/2026-11-22/16-20-00 [--plot curve.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics


def curve(rows: list[dict]) -> list[dict]:
    """One row per evaluation: step, elapsed seconds (steps + evals so far), eval figures, and the
    mean training reward of that step."""
    out, elapsed = [], 0.0
    for r in rows:
        elapsed += r.get("perf/step_s", 0.0) + r.get("perf/eval_s", 0.0)
        if "eval/accuracy" in r:
            out.append({"step": r["step"], "elapsed_s": elapsed, "accuracy": r["eval/accuracy"],
                        "tool_use": r.get("eval/tool_use_frac"), "tool_answer": r.get("eval/tool_answer_frac"),
                        "reward": r.get("rollout/reward_mean")})
    return out


def step_summary(trained: list[dict], step: int) -> tuple[dict, str]:
    """The step's first sample (not picked for its outcome) and the step's share of tool use
    and reward."""
    rows = [r for r in trained if r["train_step"] == step]
    used = sum((r.get("tool_calls") or 0) > 0 for r in rows)
    reward = sum(r["reward"] or 0 for r in rows) / len(rows)
    return rows[0], f"{used}/{len(rows)} samples called the tool, mean reward {reward:.3f}"


def plot(rows: list[dict], path: str, title: str) -> None:
    """Eval figures at each eval step; the train reward and tool calls per sample at every step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    points = curve(rows)
    for key, label in (("accuracy", "eval accuracy (greedy)"), ("tool_use", "eval: tool called"),
                       ("tool_answer", "eval: tool output = answer")):
        values = [(p["step"], p[key]) for p in points if p[key] is not None]
        if values:
            ax.plot(*zip(*values), marker="o", label=label)
    for key, label in (("rollout/reward_mean", "train reward (sampled, T=1)"),
                       ("agent/tool_calls_per_sample", "train: tool calls per sample")):
        values = [(r["step"], r[key]) for r in rows if key in r and "train/loss" in r]
        if values:
            ax.plot(*zip(*values), linewidth=1, alpha=0.8, label=label)
    ax.set_xlabel("training step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--plot", help="write the curve to this PNG file")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args(argv)
    run = Path(args.run_dir)
    if not (run / "metrics.jsonl").is_file():
        parser.error(f"run_dir={args.run_dir!r}: no metrics.jsonl there")
    rows = read_metrics(run / "metrics.jsonl")
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    print("| step | elapsed | eval accuracy | tool called | tool output = answer | train reward |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in curve(rows):
        reward = "" if c["reward"] is None else f"{c['reward']:.3f}"
        print(f"| {c['step']} | {c['elapsed_s'] / 60:.1f} min | {pct(c['accuracy'])} | {pct(c['tool_use'])} | "
              f"{pct(c['tool_answer'])} | {reward} |")
    if args.plot:
        plot(rows, args.plot, args.title or str(run))
    if steps:
        print(f"\n{len(steps)} steps, mean {sum(steps) / len(steps):.2f} s/step "
              f"(median {sorted(steps)[len(steps) // 2]:.2f} s)")
    trained, _ = read_ledger(run)
    if trained:
        for label, step in (("before (step 1)", 1), (f"after (step {trained[-1]['train_step']})",
                                                     trained[-1]["train_step"])):
            row, summary = step_summary(trained, step)
            print(f"\n{label}: {summary}; its first sample (reward {row['reward']}):\n" + json.dumps(
                {k: row.get(k) for k in ("prompt", "response", "tool_calls", "turns")}, indent=1))


if __name__ == "__main__":
    main()
