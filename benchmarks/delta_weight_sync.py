"""Delta weight syncs on SmolLM2: bytes per sync as a share of a full sync, and seconds against a full sync.

Each setting is a real run, `python train.py experiment=smollm2_arith` for `--steps` steps (one sync
after every step), its own process, read back from its metrics.jsonl (`perf/weight_sync_bytes`,
`perf/weight_sync_s`). Settings come in pairs that differ only in `engine.weight_delta`: a delta sync
leaves the engine bit for bit where a full one does, so both runs of a pair sample the same tokens and
train the same steps, which the script checks (reward, loss and gradient norm equal at every step):

- `bf16`: trainer and engine in bfloat16 (`model.dtype=bfloat16`), deltas on / off;
- `fp32->bf16`: a float32 trainer feeding a bfloat16 engine (`model.engine_dtype=bfloat16`), deltas
  on / off (a full sync sends the bfloat16 cast: half the float32 bytes);
- `bf16 disagg`: `bf16` with the engine and the trainer as Ray actors (`mode=disagg cluster=local_ray`):
  the object-store route, where the payload crosses processes (run it with `--settings`).

The first sync of a run has no base: it is a full one, and its bytes are the full size the others are
compared with. The eval is cut to 8 prompts (it runs once, at the last step) and W&B is off.

    .venv/bin/python benchmarks/delta_weight_sync.py                  # 20 steps x 4 runs: about an hour on 2 cores
    .venv/bin/python benchmarks/delta_weight_sync.py --steps 3 --settings bf16

Prints a markdown table; JSON to benchmarks/results/delta_weight_sync.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "bf16": ["model.dtype=bfloat16"],
    "fp32->bf16": ["model.engine_dtype=bfloat16"],
    # The object-store route: training rank 0 (a Ray actor) encodes, the engine actor reads one object.
    "bf16 disagg": ["model.dtype=bfloat16", "mode=disagg", "cluster=local_ray"],
}
BASE = ["experiment=smollm2_arith", "eval_every=0", "task.num_eval=8", "eval.num_prompts=8", "logger.mode=disabled",
        "save_every=0"]
SAME_EACH_STEP = ("rollout/reward_mean", "train/loss", "train/grad_norm")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    return platform.machine()


def run(overrides: list[str], out: Path) -> list[dict]:
    """One training run in its own process; its metrics rows, one per step."""
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={out}"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if "perf/weight_sync_bytes" in line]


def summary(rows: list[dict]) -> dict:
    sizes = [r["perf/weight_sync_bytes"] for r in rows]
    seconds = [r["perf/weight_sync_s"] for r in rows]
    later = [b / sizes[0] for b in sizes[1:]]  # the first sync is full: the size the others are shares of
    return {"full_bytes": sizes[0], "share_median": statistics.median(later) if later else 1.0,
            "share_min": min(later, default=1.0), "share_max": max(later, default=1.0),
            "sync_s_median": statistics.median(seconds[1:] or seconds), "first_sync_s": seconds[0],
            "steps": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--settings", nargs="+", default=["bf16", "fp32->bf16"], choices=list(SETTINGS))
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "machine": cpu_name(),
               "steps": args.steps, "settings": {}}
    with tempfile.TemporaryDirectory(prefix="delta-sync-") as tmp:
        for name in args.settings:
            runs = {}
            for delta in ("on", "off"):
                overrides = [*BASE, *SETTINGS[name], f"total_steps={args.steps}", f"engine.weight_delta={delta}"]
                rows = run(overrides, Path(tmp) / f"{name.replace('>', '')}-{delta}")
                runs[delta] = rows
                results["settings"][f"{name} delta {delta}"] = {
                    "command": "python train.py " + " ".join(overrides), **summary(rows),
                    "per_step": [{"bytes": r["perf/weight_sync_bytes"], "sync_s": r["perf/weight_sync_s"]}
                                 for r in rows]}
            same = all(a[k] == b[k] for a, b in zip(runs["on"], runs["off"]) for k in SAME_EACH_STEP)
            results["settings"][f"{name} delta on"]["same_steps_as_full"] = same
    results["load_before_after"] = [load_before[0], os.getloadavg()[0]]
    out = ROOT / "benchmarks" / "results" / "delta_weight_sync.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"{results['date']}, {results['machine']}, {args.steps} steps, 1-min load {load_before[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print("| setting | full sync MB | later syncs, share of full (median, min-max) | sync s (median, later) | "
          "first sync s | same steps as full syncs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in results["settings"].items():
        print(f"| {name} | {r['full_bytes'] / 1e6:.1f} | {r['share_median']:.4f} ({r['share_min']:.4f}-"
              f"{r['share_max']:.4f}) | {r['sync_s_median']:.3f} | {r['first_sync_s']:.3f} | "
              f"{r.get('same_steps_as_full', '')} |")


if __name__ == "__main__":
    main()
