"""N resumed lives from copies of one run killed inside a checkpoint: each first step's log-prob gap.

The first life (`train.py` with the kill test's sync settings) is SIGKILLed inside the write of
checkpoint `--kill-step` (after its files, before its DONE marker), so checkpoint `kill-step - 1`
is the newest complete one. Each resumed life starts from a fresh copy of that directory, trains
the step after the checkpoint and ends; its `train/logprob_diff_rollout` (mean |engine - trainer|
log-prob per token) and `train/logprob_diff_rollout_max` are read from metrics.jsonl. Every sample
of that step is on-policy (sync, no partial rollout, float32 on both sides), so the gap of a good
life is rounding (about 5e-7); a life whose engine computed on another state shows 1e-4 or more.
With `--vml-spy` every life runs under scripts/vml_spy.c, and its line says which MKL VML functions
had their first call on two threads at once (`raced`): the window of the defect's cause
(docs/notes/resume_race.md), whatever the CPU (on AMD CPUs such a call still computes right).

    .venv/bin/python benchmarks/resumed_lives.py --lives 200 --parallel 2 --vml-spy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import vml_spy  # noqa: E402  (scripts/vml_spy.py)
from rlharness.core.fault_points import signal_at  # noqa: E402
from rlharness.logging_utils.metrics import read_metrics  # noqa: E402

# The kill test's sync run (tests/resume/test_kill_resume.py), ending after the step it resumes into.
SYNC = ["save_every=1", "eval_every=0", "logger.mode=disabled", "batch_size=8", "sampler.prompt_repeat_k=4",
        "keep_checkpoints=2"]
# A gap above this is a perturbed life (ordinary steps stay below 1e-6; the defect gave 1e-4 to 3e-3).
PERTURBED_GAP = 1e-5


def launch(run_dir: Path, overrides: list[str], env_extra: dict | None = None,
           spy: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", **(env_extra or {})}
    if spy is not None:  # the life's own report beside its directory
        env = vml_spy.spy_env(spy, run_dir.with_suffix(".vml"), base=env)
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=run_dir.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def first_life(run_dir: Path, overrides: list[str], kill_step: int) -> None:
    run_dir.mkdir(parents=True)
    proc = launch(run_dir, overrides, signal_at("SIGKILL", "checkpoint", kill_step))
    rc = proc.wait(timeout=600)
    if rc != -signal.SIGKILL:
        raise SystemExit(f"the first life should die inside checkpoint {kill_step}; rc {rc}:\n"
                         + proc.stderr.read().decode()[-2000:])


def step_row(run_dir: Path, step: int) -> dict:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == step and "train/loss" in r]
    return rows[-1] if rows else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lives", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2, help="resumed lives running at once")
    ap.add_argument("--kill-step", type=int, default=2, help="the checkpoint the first life dies in")
    ap.add_argument("--work-dir", default=None, help="default: a temporary directory, removed at the end")
    ap.add_argument("--out", default=None, help="write one JSON line per life here")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new life after this many seconds (a shared box: report the lives that fit)")
    ap.add_argument("--vml-spy", action="store_true", help="run each life under scripts/vml_spy.c (needs gcc)")
    ap.add_argument("overrides", nargs="*", help="extra train.py overrides for every life")
    args = ap.parse_args(argv)
    overrides = [*SYNC, f"total_steps={args.kill_step}", *args.overrides]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="resumed-lives-"))
    source = work / "source"
    t0 = time.monotonic()
    spy = vml_spy.build(work) if args.vml_spy else None
    first_life(source, overrides, args.kill_step)
    print(f"first life killed inside checkpoint {args.kill_step} ({time.monotonic() - t0:.1f} s)", flush=True)
    out = open(args.out, "w") if args.out else None
    running: list[tuple[int, Path, subprocess.Popen]] = []
    results: list[dict] = []
    next_life = 0
    try:
        while next_life < args.lives or running:
            if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
                args.lives = next_life  # out of time: finish the lives running, start no more
            while next_life < args.lives and len(running) < args.parallel:
                life_dir = work / f"life-{next_life:04d}"
                shutil.copytree(source, life_dir, symlinks=True)
                running.append((next_life, life_dir, launch(life_dir, overrides, spy=spy)))
                next_life += 1
            time.sleep(0.2)
            for item in [r for r in running if r[2].poll() is not None]:
                running.remove(item)
                i, life_dir, proc = item
                row = step_row(life_dir, args.kill_step)
                gap = row.get("train/logprob_diff_rollout")
                res = {"life": i, "rc": proc.returncode, "gap": gap, "gap_max": row.get("train/logprob_diff_rollout_max"),
                       "loss": row.get("train/loss"), "perturbed": gap is None or gap > PERTURBED_GAP}
                if spy is not None:
                    res["raced"] = sorted({f for calls in vml_spy.concurrent_first_calls(
                        life_dir.with_suffix(".vml")).values() for f in calls})
                if proc.returncode != 0:
                    res["stderr"] = proc.stderr.read().decode()[-500:]
                results.append(res)
                print(json.dumps(res), flush=True)
                if out:
                    out.write(json.dumps(res) + "\n")
                    out.flush()
                if not res["perturbed"]:
                    shutil.rmtree(life_dir, ignore_errors=True)  # keep the bad ones to look at
    finally:
        for _, _, proc in running:
            proc.kill()
            proc.wait()
        if out:
            out.close()
    gaps = sorted(r["gap"] for r in results if r["gap"] is not None)
    bad = [r["life"] for r in results if r["perturbed"]]
    raced = [r["life"] for r in results if r.get("raced")]
    spied = f", {len(raced)} with a two-thread first VML call {raced}" if spy is not None else ""
    print(f"{len(results)} resumed lives, {len(bad)} perturbed {bad}{spied}; first-step gap median "
          f"{gaps[len(gaps) // 2]:.3g}, max {gaps[-1]:.3g} ({time.monotonic() - t0:.0f} s)" if gaps else "no gaps read")
    if not args.work_dir and not bad:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
