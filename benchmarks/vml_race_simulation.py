"""Issue 21's defect, made on purpose: resumed lives whose engine got MKL's low-accuracy cos/sin in
one thread's chunk of its first prefill, as a raced first VML call leaves it (docs/notes/resume_race.md).

One sync run is SIGKILLed inside checkpoint 2 (as in benchmarks/resumed_lives.py); each variant is a
resumed life from a copy of it, run with benchmarks/vml_race/ on PYTHONPATH: EP_VARIANT="cos:1" puts
the AVX2 EP values of the engine's first `cos` into chunk 1 of the two-thread split (rows 16-31 of a
32-row prefill), "cos+sin:0" those of cos and sin into chunk 0, "none" changes nothing. Prints each
life's step loss and log-prob gap, and the on-policy guard's warning. The defect's loss, in CI and
in two lives of session 5 (dd73f00, Intel Xeon): -0.005671392194926739.

On an Intel CPU with AVX-512 the EP values differ from torch's; on AMD CPUs MKL has one kernel for
every accuracy, the values are torch's and every variant trains like "none".

    .venv/bin/python benchmarks/vml_race_simulation.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import resumed_lives as lives  # benchmarks/resumed_lives.py: the first life, the launch, the step's row

HOOK = Path(__file__).with_name("vml_race")
VARIANTS = ["none", "cos:1", "sin:1", "cos+sin:1", "cos+sin:0"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args(argv)
    overrides = [*lives.SYNC, "total_steps=2"]
    work = Path(tempfile.mkdtemp(prefix="vml-race-"))
    try:
        t0 = time.monotonic()
        lives.first_life(work / "source", overrides, kill_step=2)
        pending, running = list(enumerate(args.variants)), []
        while pending or running:
            while pending and len(running) < args.parallel:
                i, variant = pending.pop(0)
                life = work / f"life-{i}"
                shutil.copytree(work / "source", life, symlinks=True)
                env = {"EP_VARIANT": variant, "PYTHONPATH": os.pathsep.join(
                    p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)}
                running.append((variant, life, lives.launch(life, overrides, env)))
            time.sleep(0.2)
            for item in [r for r in running if r[2].poll() is not None]:
                running.remove(item)
                variant, life, proc = item
                row = lives.step_row(life, 2)
                stderr = proc.stderr.read().decode()
                log = (life / "train.log").read_text() if (life / "train.log").exists() else ""
                print(json.dumps({"variant": variant, "rc": proc.returncode, "loss": row.get("train/loss"),
                                  "gap": row.get("train/logprob_diff_rollout"),
                                  "gap_max": row.get("train/logprob_diff_rollout_max"),
                                  "changed": [line for line in stderr.splitlines() if line.startswith("EP values")],
                                  "guard": [line.split(" - ", 1)[-1][:400] for line in log.splitlines()
                                            if "every sample is on-policy" in line]}), flush=True)
        print(f"{len(args.variants)} lives ({time.monotonic() - t0:.0f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
