"""Wall time per trained sample: disaggregated async (Ray actors) vs colocated sync, same task and settings.

Runs the real command line twice on this machine:
  python train.py mode=colocate strategy=sync  cluster=local     <common settings>
  python train.py mode=disagg   strategy=async cluster=local_ray max_staleness=1 <common settings>
reads each run's metrics.jsonl and compares the steady state: the sum of `perf/step_s`
over the steps after `--warmup`, divided by the samples trained in them (startup,
Ray included, is reported separately as process wall time, not in the ratio).
Prints a table and writes benchmarks/results/disagg_vs_colocate[_quick].csv.

    python benchmarks/disagg_vs_colocate.py            # full: 40 steps x 16 prompts x 8 samples
    python benchmarks/disagg_vs_colocate.py --repeats 3  # three pairs, alternating order; median ratio
    python benchmarks/disagg_vs_colocate.py --quick    # 4 steps x 4 x 4 (a test runs this)
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "colocate_sync": ["mode=colocate", "strategy=sync", "cluster=local", "max_staleness=0"],
    "disagg_async": ["mode=disagg", "strategy=async", "cluster=local_ray", "max_staleness=1"],
}


def common_args(steps: int, batch_size: int, k: int) -> list[str]:
    return [f"total_steps={steps}", f"batch_size={batch_size}", f"sampler.prompt_repeat_k={k}", "eval_every=0",
            "eval.num_prompts=8", "save_every=0", "logger=none", "seed=0"]


def run_one(name: str, args: list[str], run_dir: Path, timeout_s: float) -> float:
    """Run train.py; returns the process wall time (s)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
                         cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: train.py exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return time.monotonic() - start


def summarize(name: str, run_dir: Path, warmup: int, process_wall_s: float) -> dict[str, float | str]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] > warmup]
    if not steps:
        raise RuntimeError(f"{name}: no training steps after warmup={warmup} in {run_dir}/metrics.jsonl")
    step_s = sum(r["perf/step_s"] for r in steps)
    samples = sum(r["perf/samples_per_s"] * r["perf/step_s"] for r in steps)
    return {
        "run": name,
        "steps_measured": len(steps),
        "samples": round(samples),
        "step_s_total": step_s,
        "s_per_sample": step_s / samples,
        "train_s_mean": sum(r["perf/train_s"] for r in steps) / len(steps),
        "rollout_wait_s_mean": sum(r["perf/rollout_s"] for r in steps) / len(steps),
        "weight_sync_s_mean": sum(r["perf/weight_sync_s"] for r in steps) / len(steps),
        "engine_busy_frac_mean": sum(r.get("perf/engine_busy_frac", 0.0) for r in steps) / len(steps),
        "trainer_idle_frac_mean": sum(r.get("perf/trainer_idle_frac", 0.0) for r in steps) / len(steps),
        "train_worker_s_mean": sum(r.get("perf/train_worker_s", 0.0) for r in steps) / len(steps),
        "staleness_mean": sum(r["staleness/mean"] for r in steps) / len(steps),
        "reward_mean": sum(r["rollout/reward_mean"] for r in steps) / len(steps),
        "process_wall_s": process_wall_s,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 steps x 4 prompts x 4 samples")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the steady state")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each mode this often, alternating which goes first; the ratio is the median")
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    a = parser.parse_args(argv)
    if a.quick:
        a.steps, a.batch_size, a.k, a.warmup = 4, 4, 4, 1
    common = common_args(a.steps, a.batch_size, a.k)
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="disagg-bench-") as tmp:
        for rep in range(a.repeats):
            names = list(RUNS) if rep % 2 == 0 else list(reversed(RUNS))  # neither mode always runs first
            pair = {}
            for name in names:
                run_dir = Path(tmp) / f"{name}-{rep}"
                wall = run_one(name, [*RUNS[name], *common], run_dir, a.timeout_s)
                pair[name] = summarize(name, run_dir, a.warmup, wall)
                pair[name]["repeat"] = rep
            for name in RUNS:
                pair[name]["ratio_vs_colocate"] = pair[name]["s_per_sample"] / pair["colocate_sync"]["s_per_sample"]
                results.append(pair[name])
    ratios = sorted(r["ratio_vs_colocate"] for r in results if r["run"] == "disagg_async")
    ratio = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1:][:2]) / 2

    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"disagg_vs_colocate{'_quick' if a.quick else ''}.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    settings = " ".join(common)
    print(f"disagg async vs colocated sync, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"1-min load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}: {settings}")
    print("| run | repeat | s/sample | train s | worker train s | batch wait s | trainer idle | sync s | "
          "engine busy | staleness | process s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['run']} | {r['repeat']} | {r['s_per_sample']:.4f} | {r['train_s_mean']:.3f} | "
              f"{r['train_worker_s_mean']:.3f} | {r['rollout_wait_s_mean']:.3f} | {r['trainer_idle_frac_mean']:.2f} | "
              f"{r['weight_sync_s_mean']:.3f} | {r['engine_busy_frac_mean']:.2f} | {r['staleness_mean']:.2f} | "
              f"{r['process_wall_s']:.1f} |")
    print(f"ratio (disagg / colocate, wall time per trained sample): {ratio:.3f}"
          f"{f' (median of {ratios})' if len(ratios) > 1 else ''}; written to {out}")
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
