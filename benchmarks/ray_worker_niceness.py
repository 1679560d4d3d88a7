"""A disaggregated tiny run beside busy processes: Ray's worker niceness, wall time.

Ray starts its worker processes at nice +15 (`RAY_worker_niceness`, to spare its own daemons). In a
disaggregated run those workers are the run's engines and trainers; beside any busy process at
nice 0 (another job, another test, a browser) the kernel gives them a few percent of a core.
`connect_ray` sets `RAY_worker_niceness=0` unless the user set it: workers run at the driver's
priority. This measures one 2-step `mode=disagg` run alone, then beside `--busy` spinning
processes (default: one per core) under each niceness.

    .venv/bin/python benchmarks/ray_worker_niceness.py --steps 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ["mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=1", "batch_size=4",
       "sampler.prompt_repeat_k=4", "eval_every=0", "logger=none", "save_every=0", "timeout_s=900"]


def spin() -> None:
    while True:
        pass


def disagg_run(steps: int, niceness: str, busy: int, out: Path) -> float:
    """Wall seconds of one run with `busy` spinning processes beside it."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": niceness}
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    try:
        start = time.perf_counter()
        with (out.parent / f"{out.name}.log").open("w") as log:  # a file: nobody reads a pipe while it runs
            code = subprocess.call([sys.executable, str(ROOT / "train.py"), *RUN, f"total_steps={steps}",
                                    f"hydra.run.dir={out}"], env=env, cwd=ROOT, stdout=log, stderr=log)
        wall_s = time.perf_counter() - start
    finally:
        for p in spinners:
            p.kill()
    if code != 0:
        sys.exit(f"the run failed (niceness {niceness}, {busy} busy): see {out.parent / f'{out.name}.log'}")
    return wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--busy", type=int, default=os.cpu_count(), help="spinning processes beside the run")
    args = parser.parse_args()
    print(f"one tiny disagg run, {args.steps} steps, on {os.cpu_count()} cores")
    print(f"{'beside':>14} {'RAY_worker_niceness':>20} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for busy, niceness in ((0, "15"), (args.busy, "15"), (args.busy, "0"), (0, "0")):
            wall_s = disagg_run(args.steps, niceness, busy, Path(tmp) / f"busy{busy}_nice{niceness}")
            print(f"{f'{busy} busy':>14} {niceness + (' (Ray default)' if niceness == '15' else ''):>20} "
                  f"{wall_s:7.1f}", flush=True)


if __name__ == "__main__":
    main()
