"""On-policy distillation against GRPO: steps and CPU seconds to 90% of the teacher's eval accuracy,
from the same start on the same batches (same seed: the sampler draws the same prompts in the same order).

    python benchmarks/distill_curves.py                 # the embedded model: both arms, 200 steps, eval every 10
    python benchmarks/distill_curves.py --steps 300 --arms grpo
    python benchmarks/distill_curves.py --model smollm2 --steps 16 --eval-every 2   # SmolLM2-135M-Instruct

`--model tiny`: the teacher is `assets/tiny-arith-teacher`, the embedded default model after the default
run (`python train.py`, 400 GRPO steps), exported with `python -m rlharness.export`; the student the
untrained embedded model (`assets/tiny-arith`, 17.5%). `--model smollm2`: the teacher is
SmolLM2-135M-Instruct after `experiment=smollm2_arith`, exported into outputs/distill/smollm2-teacher;
the student SmolLM2-135M-Instruct (`bash scripts/fetch_smollm2.sh` first). A missing teacher is made
first (`--make-teacher` makes it again): the tiny one takes about half an hour on a 2-core CPU. The
teacher's run is GRPO from the student's start, so when it is made in the same call with the same steps
and eval interval it is the GRPO arm (not run twice).

Each arm is `python train.py` in a process of its own; its CPU seconds (process and children, user +
system) are sampled whenever metrics.jsonl grows, so each step has the CPU time spent up to it.
Writes benchmarks/results/distill_<model>.json (per arm: step, eval accuracy, wall and CPU seconds) and
docs/img/distill_<model>.png (accuracy by step and by CPU s), and prints the table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
# model -> (the teacher's folder, the run that makes it, the overrides of every run)
PRESETS = {
    "tiny": (ROOT / "assets" / "tiny-arith-teacher", ROOT / "outputs" / "distill" / "tiny_teacher_run", []),
    "smollm2": (ROOT / "outputs" / "distill" / "smollm2-teacher", ROOT / "outputs" / "distill" / "smollm2_teacher_run",
                ["experiment=smollm2_arith"]),
}
ARMS = ("opd", "grpo")
TARGET_FRAC = 0.9
TEACHER, TEACHER_RUN, BASE = PRESETS["tiny"]
OUT = ROOT / "benchmarks" / "results" / "distill_tiny.json"


def arm_overrides(name: str) -> list[str]:
    return [*BASE, *(["algo=opd", f"algo.teacher.path={TEACHER}"] if name == "opd" else [])]


def make_teacher() -> list[dict]:
    """The preset's own run (GRPO, its configured steps), exported as a Hugging Face folder into TEACHER.
    Returns the run's curve: the GRPO arm from the same start with the same steps is this run."""
    rows = run_arm("grpo", [], TEACHER_RUN)
    if TEACHER.exists():
        shutil.rmtree(TEACHER)
    subprocess.run([sys.executable, "-m", "rlharness.export", str(TEACHER_RUN), str(TEACHER)], cwd=ROOT, check=True)
    return rows


def teacher_accuracy() -> float:
    """The teacher's eval accuracy: its run's last eval, or an eval of the folder."""
    metrics = TEACHER_RUN / "metrics.jsonl"
    if metrics.is_file():
        evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if "eval/accuracy" in r]
        if evals:
            return float(evals[-1]["eval/accuracy"])
    run = TEACHER_RUN.parent / f"{TEACHER.name}_eval"
    if run.exists():
        shutil.rmtree(run)
    subprocess.run([sys.executable, "train.py", *BASE, f"model.path={TEACHER}", "total_steps=0", "logger=none",
                    f"hydra.run.dir={run}"], cwd=ROOT, check=True)
    return float(json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["eval/accuracy"])


def cpu_s(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_arm(name: str, overrides: list[str], run_dir: Path) -> list[dict]:
    """The arm's steps: step, eval accuracy (eval steps), wall and CPU seconds since it started."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "train.py", *arm_overrides(name), *overrides, "logger=none", "resume=never",
           f"hydra.run.dir={run_dir}"]
    print(" ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = psutil.Process(child.pid)
    metrics, rows, seen = run_dir / "metrics.jsonl", [], 0
    last_cpu = 0.0
    while True:
        done = child.poll() is not None
        if not done:
            last_cpu = cpu_s(proc)  # the children's times vanish with them: keep the last reading
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        for line in lines[seen:]:
            r = json.loads(line)
            rows.append({"step": r["step"], "eval_accuracy": r.get("eval/accuracy"),
                         "distill_reverse_kl": r.get("distill/reverse_kl"),
                         "wall_s": round(time.monotonic() - t0, 1), "cpu_s": round(last_cpu, 1)})
        seen = len(lines)
        if done:
            break
        time.sleep(0.5)
    if child.returncode:
        raise SystemExit(f"{name}: train.py exited {child.returncode} (see {run_dir}/train.log)")
    return rows


def same_schedule(steps: int, eval_every: int) -> bool:
    """Whether the teacher's run had these steps and this eval interval (its resolved config)."""
    conf = yaml.safe_load((TEACHER_RUN / ".hydra" / "config.yaml").read_text())
    return conf["total_steps"] == steps and conf["eval_every"] == eval_every


def first_reaching(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r["eval_accuracy"] is not None and r["eval_accuracy"] >= target), None)


def plot(result: dict, path: Path, title: str) -> None:
    """Eval accuracy of each arm by step and by CPU second, with the teacher's and the target's lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True)
    for ax, x, label in zip(axes, ("step", "cpu_s"), ("training step", "CPU s (training process and children)")):
        for name, arm in result["arms"].items():
            points = [(r[x], r["eval_accuracy"]) for r in arm["curve"] if r["eval_accuracy"] is not None]
            ax.plot(*zip(*points), marker="o", markersize=3, label=f"algo={name}")
        ax.axhline(result["teacher_accuracy"], color="gray", linestyle="--", linewidth=1, label="teacher")
        ax.axhline(result["target_accuracy"], color="gray", linestyle=":", linewidth=1, label="90% of the teacher")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy eval accuracy")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--make-teacher", action="store_true")
    parser.add_argument("--model", choices=list(PRESETS), default="tiny")
    args = parser.parse_args()
    global TEACHER, TEACHER_RUN, BASE, OUT
    TEACHER, TEACHER_RUN, BASE = PRESETS[args.model]
    OUT = ROOT / "benchmarks" / "results" / f"distill_{args.model}.json"
    teacher_rows = None
    if args.make_teacher or not (TEACHER / "config.json").is_file():
        teacher_rows = make_teacher()
    teacher_acc = teacher_accuracy()
    target = TARGET_FRAC * teacher_acc
    result = json.loads(OUT.read_text()) if OUT.is_file() else {}
    result.update({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg": os.getloadavg(),
                   "teacher_accuracy": teacher_acc, "target_accuracy": round(target, 4)})
    for name in args.arms:
        if name == "grpo" and teacher_rows and same_schedule(args.steps, args.eval_every):
            rows = teacher_rows  # the teacher's run is this arm: same start, config, seed and steps
        else:
            rows = run_arm(name, [f"total_steps={args.steps}", f"eval_every={args.eval_every}", "save_every=0"],
                           TEACHER_RUN.parent / f"bench_{OUT.stem}_{name}")
        hit = first_reaching(rows, target)
        result.setdefault("arms", {})[name] = {
            "steps": args.steps, "curve": rows, "load_avg_after": os.getloadavg(),
            "target_step": hit and hit["step"], "target_cpu_s": hit and hit["cpu_s"],
            "target_wall_s": hit and hit["wall_s"]}
        OUT.write_text(json.dumps(result, indent=1) + "\n")
    figure = ROOT / "docs" / "img" / f"distill_{args.model}.png"
    plot(result, figure, f"on-policy distillation against GRPO from the same start ({args.model})")
    print(f"teacher {teacher_acc:.3f}, target {target:.3f} (load {result['load_avg'][0]:.1f}); figure {figure}")
    print("| arm | steps to target | CPU s to target | wall s to target | accuracy by step |")
    for name, arm in result["arms"].items():
        evals = " ".join(f"{r['step']}:{100 * r['eval_accuracy']:.1f}" for r in arm["curve"]
                         if r["eval_accuracy"] is not None)
        print(f"| {name} | {arm['target_step']} | {arm['target_cpu_s']} | {arm['target_wall_s']} | {evals} |")


if __name__ == "__main__":
    main()
