"""Tiny-model runs side by side, as `pytest -n 2` runs them: OpenMP's wait policy, CPU and wall time.

torch's CPU build runs its intra-op pool on GNU OpenMP (libgomp). Unless told otherwise, a libgomp
thread that finishes its share of a parallel region spins (GOMP_SPINCOUNT, 300,000 iterations:
milliseconds) before it sleeps. A tiny model's ops last microseconds and come one after another
from Python, so the pool's second thread spins nearly all the time: a run holds both cores while it
computes on one. Alone on the machine that costs nothing; two runs at once (two pytest workers, a
test's subprocess beside another) take that core from each other. `OMP_WAIT_POLICY=PASSIVE` makes
the threads sleep at once. The numbers are the same either way (checked here: each run's losses).

    .venv/bin/python benchmarks/omp_wait_policy.py --runs 2 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["eval_every=0", "logger.mode=disabled", "save_every=0", "batch_size=8", "sampler.prompt_repeat_k=4"]


def side_by_side(runs: int, steps: int, policy: str | None, out: Path) -> tuple[float, float, list[list[float]]]:
    """`runs` train.py processes at once: (wall s, their CPU s summed, each run's per-step losses)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out.mkdir(parents=True)
    logs = [out / f"run{i}.err" for i in range(runs)]  # a file, not a pipe: nobody reads while they run
    start = time.perf_counter()
    procs = []
    for i, log in enumerate(logs):
        with log.open("w") as err:  # the child keeps its own copy of the descriptor
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "train.py"), *RUN, f"total_steps={steps}",
                                           f"seed={i}", f"hydra.run.dir={out / f'run{i}'}"], env=env, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=err))
    cpu_s = 0.0
    for proc, log in zip(procs, logs):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            sys.exit(f"a run failed (OMP_WAIT_POLICY={policy}): {log.read_text()[-2000:]}")
        cpu_s += usage.ru_utime + usage.ru_stime
    wall_s = time.perf_counter() - start
    losses = [[json.loads(line)["train/loss"] for line in (out / f"run{i}" / "metrics.jsonl").read_text().splitlines()
               if json.loads(line).get("step", 0) > 0] for i in range(runs)]
    return wall_s, cpu_s, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="train.py processes at once")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds per policy")
    args = parser.parse_args()
    print(f"{args.runs} tiny colocated runs at once, {args.steps} steps each, on {os.cpu_count()} cores")
    print(f"{'OMP_WAIT_POLICY':>16} {'round':>5} {'wall s':>7} {'CPU s':>7}")
    losses_by_policy = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for policy in (None, "PASSIVE"):
                out = Path(tmp) / f"{policy}_{round_}"
                wall_s, cpu_s, losses = side_by_side(args.runs, args.steps, policy, out)
                losses_by_policy.setdefault(policy, losses)
                assert losses == losses_by_policy[policy], "a run's losses changed between rounds"
                print(f"{policy or '(unset)':>16} {round_:>5} {wall_s:7.1f} {cpu_s:7.1f}")
    same = losses_by_policy[None] == losses_by_policy["PASSIVE"]
    print(f"losses identical under both policies: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
