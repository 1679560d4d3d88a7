"""CPU seconds per step of the default run (`python train.py`) in one or more checkouts, side by side.

Wall time on a shared 2-core box says more about the other processes than about the code, so this
records, for every training step, the process's CPU seconds (all its threads: the step, and within it
the backend's `train_step_blocking`; the sync strategy runs nothing else meanwhile) next to the wall
seconds. Each checkout's `train.py` runs with that checkout's package (PYTHONPATH), under this script's
interpreter, in a run directory under --out; with several checkouts they start together (--pairs times,
the start order swapped each time), so they share the box alike. Steps 1-2 are left out of the medians
(warm-up). /usr/bin/time's user+sys of the whole run (with the child processes it waited for) is reported too.

    python benchmarks/default_run_cpu.py --checkout /tmp/before --checkout . --steps 40 --pairs 2
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(out_path: str, overrides: list[str]) -> None:
    """In the run's process: wrap the step and the backend's training, then run train.py from cwd."""
    import rlharness.trainer.trainer as tr

    try:
        from rlharness.backend.learner import Learner as Backend
    except ImportError:  # a checkout from before the learner: backend=torch was torch_backend.TorchBackend
        from rlharness.backend.torch_backend import TorchBackend as Backend

    out, train = open(out_path, "w"), {}
    train_step_blocking, train_one_step = Backend.train_step_blocking, tr.Trainer._train_one_step

    def timed_train(self, batch):
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            return train_step_blocking(self, batch)
        finally:
            train.update(train_cpu=time.process_time() - c0, train_wall=time.perf_counter() - w0)

    async def timed_step(self, step, *args, **kwargs):
        c0, w0 = time.process_time(), time.perf_counter()
        result = await train_one_step(self, step, *args, **kwargs)
        out.write(json.dumps({"step": step, "cpu": time.process_time() - c0, "wall": time.perf_counter() - w0,
                              **train}) + "\n")
        out.flush()
        return result

    Backend.train_step_blocking, tr.Trainer._train_one_step = timed_train, timed_step
    sys.argv = ["train.py", *overrides]
    runpy.run_path("train.py", run_name="__main__")


def summary(steps_file: Path, time_file: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in steps_file.read_text().splitlines()][2:]
    med = {k: round(statistics.median(r[k] for r in rows), 4) for k in ("cpu", "wall", "train_cpu", "train_wall")}
    user, sys_s, wall = (float(x) for x in time_file.read_text().split()[-3:])
    return {**med, "steps": len(rows), "run_cpu_s": round(user + sys_s, 1), "run_wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkout", action="append", required=True, help="a checkout's root (repeat to compare)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--pairs", type=int, default=1, help="rounds, the start order swapped each round")
    p.add_argument("--out", default="/tmp/default_run_cpu")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1:])
    checkouts = [Path(c).resolve() for c in a.checkout]
    print("| round | checkout | load at start | median step CPU s | median step wall s | median train CPU s "
          "| median train wall s | run CPU s (user+sys) | run wall s |\n|---|---|---|---|---|---|---|---|---|")
    for r in range(a.pairs):
        order = checkouts if r % 2 == 0 else checkouts[::-1]
        load, procs = os.getloadavg()[0], []
        for i, c in enumerate(order):
            tag = Path(a.out) / f"r{r}_{i}_{c.name}"
            tag.mkdir(parents=True, exist_ok=True)
            cmd = ["/usr/bin/time", "-o", str(tag / "time.txt"), "-f", "%U %S %e", sys.executable, __file__,
                   "--checkout", str(c), "--child", str(tag / "steps.jsonl"), f"total_steps={a.steps}",
                   "eval_every=0", f"hydra.run.dir={tag / 'run'}"]
            env = {**os.environ, "PYTHONPATH": str(c)}
            procs.append((c, tag, subprocess.Popen(cmd, cwd=c, env=env, stdout=subprocess.DEVNULL,
                                                   stderr=open(tag / "stderr.txt", "w"))))
        for c, tag, proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"error: the run in {c} failed (exit {proc.returncode}); see {tag / 'stderr.txt'}")
            s = summary(tag / "steps.jsonl", tag / "time.txt")
            print(f"| {r + 1} | {c} | {load:.1f} | {s['cpu']} | {s['wall']} | {s['train_cpu']} | {s['train_wall']} "
                  f"| {s['run_cpu_s']} | {s['run_wall_s']} |")


if __name__ == "__main__":
    main()
