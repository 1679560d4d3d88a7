"""Learning with each policy loss and off-policy correction: the default task, same seed.

Runs `python train.py` once per case, one after another (each is a real run: tiny
model, arithmetic, hf engine, torch backend), and reads eval accuracy from each run's
metrics.jsonl. Every case uses `algo.mini_batches=2` (two optimizer steps per batch), so
the second update's ratio against the old policy is not 1 and the losses actually
differ; with one update per batch every loss has the plain policy gradient (see
tests/algo/test_policy_losses.py). Results: benchmarks/results/policy_losses.{json,md}.

    python benchmarks/policy_losses.py --steps 100 --out-dir /tmp/losses
    python benchmarks/policy_losses.py --only ppo,cispo --merge   # re-run two, keep the others' results
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["algo.mini_batches=2", "logger=none", "resume=never"]
CASES: dict[str, list[str]] = {
    "ppo": ["algo.policy_loss=ppo"],
    "dual_clip": ["algo.policy_loss=dual_clip"],
    "gspo": ["algo.policy_loss=gspo", "algo.loss_agg=seq_mean_token_mean"],
    "cispo": ["algo.policy_loss=cispo"],
    # Off-policy corrections on stale samples (async producer, one version stale allowed).
    "async_tis_token": ["strategy=async", "max_staleness=1"],
    "async_tis_sequence": ["strategy=async", "max_staleness=1", "algo.tis_level=sequence"],
    "async_reject_sequence": ["strategy=async", "max_staleness=1", "algo.rejection=sequence"],
}


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(name: str, overrides: list[str], rows: list[dict], wall_s: float, rc: int) -> dict:
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if r.get("step", 0) > 0 and "train/loss" in r]
    finite = all(math.isfinite(v) for r in train for k, v in r.items() if isinstance(v, float))
    return {
        "case": name, "overrides": overrides, "rc": rc, "steps": train[-1]["step"] if train else 0,
        "eval": evals, "acc_start": evals[0][1] if evals else None, "acc_end": evals[-1][1] if evals else None,
        "all_finite": finite, "wall_s": round(wall_s, 1),
        "clip_frac_mean": sum(r["train/clip_frac"] for r in train) / max(len(train), 1),
        "rejected_frac_mean": sum(r.get("train/rejected_frac", 0.0) for r in train) / max(len(train), 1),
        "tis_truncated_frac_mean": sum(r["train/tis_truncated_frac"] for r in train) / max(len(train), 1),
        "staleness_mean": sum(r.get("staleness/mean", 0.0) for r in train) / max(len(train), 1),
    }


def to_markdown(results: list[dict], steps: int, seed: int) -> str:
    lines = ["| case | overrides | steps | eval acc first -> last | all finite | clip frac | rejected | TIS truncated | staleness |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r["acc_end"] is None:
            lines.append(f"| {r['case']} | `{' '.join(r['overrides'])}` | {r['steps']} | failed (rc {r['rc']}) | | | | | |")
            continue
        lines.append(
            f"| {r['case']} | `{' '.join(r['overrides'])}` | {r['steps']} | {r['acc_start']:.3f} -> {r['acc_end']:.3f} | "
            f"{'yes' if r['all_finite'] else 'NO'} | {r['clip_frac_mean']:.4f} | {r['rejected_frac_mean']:.4f} | "
            f"{r['tis_truncated_frac_mean']:.4f} | {r['staleness_mean']:.2f} |")
    lines.append(f"\nseed={seed}, `{' '.join(COMMON)}`; eval = greedy accuracy on 200 held-out problems.")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps per case (>= 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help=f"comma-separated cases out of {','.join(CASES)}")
    p.add_argument("--out-dir", default="/tmp/rlharness-policy-losses", help="where the run directories go")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "policy_losses"),
                   help="path prefix of the .json and .md results")
    p.add_argument("--merge", action="store_true", help="keep the results file's other cases, replace those run")
    args = p.parse_args()
    if args.steps < 1:
        p.error(f"--steps={args.steps}: expected >= 1")
    names = [n for n in args.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"--only: unknown case(s) {unknown}; expected some of {list(CASES)}")
    results = []
    for name in names:
        run_dir = Path(args.out_dir) / name
        overrides = [*CASES[name], *COMMON, f"total_steps={args.steps}", f"eval_every={max(args.steps // 2, 1)}",
                     f"seed={args.seed}", f"hydra.run.dir={run_dir}"]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall_s = time.monotonic() - t0
        if proc.returncode != 0:
            print(f"{name}: rc={proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
        rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        results.append(summarise(name, CASES[name], rows, wall_s, proc.returncode))
        print(json.dumps(results[-1]), flush=True)
    json_path = Path(args.results + ".json")
    if args.merge and json_path.exists():
        fresh = {r["case"]: r for r in results}
        kept = {r["case"]: r for r in json.loads(json_path.read_text()) if r["case"] not in fresh}
        results = [({**kept, **fresh})[n] for n in CASES if n in kept or n in fresh]
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    Path(args.results + ".md").write_text(to_markdown(results, args.steps, args.seed))
    return 0 if all(r["rc"] == 0 and r["all_finite"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
