"""Every path with the real model (SmolLM2-135M-Instruct, issue 20): a few steps each, and the
engine's log-probs against the trainer's recomputation (`train/logprob_diff_rollout`).

    python benchmarks/real_model_paths.py run NAME [overrides ...]   # one path, into OUT/NAME
    python benchmarks/real_model_paths.py table NAME ...              # the markdown table of runs

`run` starts `train.py experiment=chat_math model=smollm2` with small settings (2 prompts x 2
samples x 24 tokens, 4 eval prompts, W&B off) plus the overrides, under `nice -n 10`, with the
python given by $PYTHON (`.venv-vllm/bin/python` for engine=vllm). OUT is $REAL_MODEL_OUT or
/tmp/real_model_paths. Each row of the table: the mean absolute difference per response token
between the log-prob the engine sampled with and the trainer's recomputation on the same weights
before the update (first epoch only), per step, and the timings of the last step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("REAL_MODEL_OUT", "/tmp/real_model_paths"))
SMALL = ["experiment=chat_math", "model=smollm2", "batch_size=2", "sampler.prompt_repeat_k=2",
         "agent.sampling.max_tokens=24", "eval_every=0", "eval.num_prompts=4", "save_every=0",
         "logger.mode=disabled", "total_steps=2"]


def run(name: str, overrides: list[str]) -> int:
    run_dir = OUT / name
    if run_dir.exists():
        raise SystemExit(f"error: {run_dir} exists; remove it or pick another name")
    python = os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    keys = {o.split("=", 1)[0] for o in overrides}
    base = [o for o in SMALL if o.split("=", 1)[0] not in keys]  # an override replaces its default
    cmd = ["nice", "-n", "10", python, str(ROOT / "train.py"), *base, *overrides, f"hydra.run.dir={run_dir}"]
    print(" ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{name}: exit {proc.returncode}, {time.monotonic() - t0:.0f} s wall, load {' '.join(load)}")
    return proc.returncode


def table(names: list[str]) -> str:
    lines = ["| run | logprob_diff_rollout per step | reward per step | rollout_s / train_s / sync_s (last step) |",
             "| --- | --- | --- | --- |"]
    for name in names:
        rows = [json.loads(ln) for ln in (OUT / name / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if "train/loss" in r]
        diffs = ", ".join(f"{r['train/logprob_diff_rollout']:.2e}" for r in train)
        rewards = ", ".join(f"{r['rollout/reward_mean']:.2f}" for r in train)
        last = train[-1] if train else {}
        timing = " / ".join(f"{last.get(k, float('nan')):.1f}"
                            for k in ("perf/rollout_s", "perf/train_s", "perf/weight_sync_s"))
        lines.append(f"| {name} | {diffs} | {rewards} | {timing} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        sys.exit(run(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        print(table(sys.argv[2:]))
        sys.exit(0)
    print(__doc__, file=sys.stderr)
    sys.exit(2)
