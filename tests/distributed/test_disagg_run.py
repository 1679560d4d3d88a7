"""The real command line: `train.py mode=disagg cluster=local_ray strategy=async max_staleness=1` on the
tiny model (CPU), its rollout ledger, and a resume after SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlharness.core.run_dir import DONE, RunDir
from tests.helpers import HANG_S, run_cli, start_cli, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MAX_STALENESS = 1
ARGS = ["mode=disagg", "cluster=local_ray", "strategy=async", f"max_staleness={MAX_STALENESS}",
        "strategy.over_sample_threshold=0.5", "strategy.enable_partial_rollout=true", "batch_size=4",
        "sampler.prompt_repeat_k=4", "eval_every=0", "eval.num_prompts=8", "logger=none", "save_every=2"]
# The run's own timeout_s stays at its default (600 s): a bound on waits that must succeed, which only
# a hang reaches (an actor start took a minute on a busy CI box).


ENV = {"RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def train_args(run_dir: Path, *extra: str) -> list[str]:
    return [*ARGS, f"hydra.run.dir={run_dir}", *extra]


def train_cmd(run_dir: Path, *extra: str) -> list[str]:
    """The whole command line (the vLLM venv's test starts it with subprocess)."""
    return [sys.executable, str(ROOT / "train.py"), *train_args(run_dir, *extra)]


def env() -> dict[str, str]:
    return {**os.environ, **ENV}


def ledger(run_dir: Path) -> tuple[list[dict], list[dict]]:
    trained = [json.loads(line) for f in sorted(RunDir(run_dir).rollouts.glob("step_*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    dropped_file = RunDir(run_dir).dropped
    dropped = [json.loads(line) for line in dropped_file.read_text().splitlines()] if dropped_file.exists() else []
    return trained, dropped


def check_ledger(run_dir: Path, total_steps: int) -> None:
    trained, dropped = ledger(run_dir)
    assert {r["train_step"] for r in trained} == set(range(1, total_steps + 1))
    for r in trained:  # the staleness bound, per sample: train_step - min version - 1
        assert r["status"] == "completed"
        assert 0 <= r["train_step"] - r["min_policy_version"] - 1 <= MAX_STALENESS, r
    groups = {r["group_id"]: (r["epoch"], r["prompt_index"]) for r in trained}
    per_prompt = Counter(groups.values())
    assert all(n == 1 for n in per_prompt.values()), {k: n for k, n in per_prompt.items() if n > 1}
    assert len(groups) == 4 * total_steps  # batch_size groups per step, none lost
    assert not set(groups) & {r.get("group_id") for r in dropped}
    per_group = Counter(r["group_id"] for r in trained)
    assert set(per_group.values()) == {4}


@pytest.mark.timeout(HANG_S + 60)
def test_disagg_async_run_holds_the_staleness_bound_and_loses_no_prompt(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(train_args(run_dir, "total_steps=6"), cwd=tmp_path, env=ENV, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    check_ledger(run_dir, 6)
    rows = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 6
    for r in steps:
        assert r["staleness/max"] <= MAX_STALENESS
        assert 0.0 <= r["perf/engine_busy_frac"] <= 1.0 and r["perf/engine_restarts"] == 0
        assert r["perf/engine_version"] == r["step"]  # every step's weights reached the engine
    assert (RunDir(run_dir).checkpoint(6) / DONE).exists()


@pytest.mark.timeout(2 * HANG_S + 60)
def test_disagg_run_killed_mid_step_resumes_and_continues(tmp_path):
    run_dir = tmp_path / "run"
    # 400 steps: far more than it gets to, so it is running whenever the kill lands.
    proc = start_cli(train_args(run_dir, "total_steps=400"), cwd=tmp_path, env=ENV, new_session=True)
    try:
        wait_until(lambda: (RunDir(run_dir).checkpoint(4) / DONE).exists() or proc.poll() is not None,
                   "a checkpoint at step 4")
        assert proc.poll() is None, "the run ended before its second checkpoint"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started, mid-step
        proc.wait()
    saved = sorted(int(p.name.split("_")[1]) for p in RunDir(run_dir).checkpoints.glob("step_*")
                   if (p / "DONE").exists())
    last = saved[-1]
    total = last + 3
    out = run_cli([f"resume={run_dir}", f"total_steps={total}"], cwd=tmp_path, env=ENV, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    log_text = RunDir(run_dir).log().read_text()
    assert re.search(rf"resum\w* from {re.escape(str(run_dir))}/checkpoints/step_{last:08d}", log_text)
    assert (RunDir(run_dir).checkpoint(total) / DONE).exists()
    # Steps after the checkpoint were trained again, each once; the ledger still loses and repeats nothing.
    for f in RunDir(run_dir).rollouts.glob("step_*.jsonl"):
        if int(f.stem.split("_")[1]) > total:
            f.unlink()  # trained by the killed run after its last checkpoint, beyond the resumed run's end
    check_ledger(run_dir, total)


def critic_updates(ckpt: Path) -> set[int]:
    """The critic's AdamW step count per parameter in a checkpoint (one update per training step here)."""
    from rlharness.core.checkpoint import load_state

    state = load_state(ckpt / "backend" / "critic" / "critic_state.pt")["optimizer"]["state"]
    return {int(s["step"]) for s in state.values()}


@pytest.mark.timeout(2 * HANG_S + 60)
def test_disagg_async_ppo_trains_the_critic_in_the_training_actor_and_resumes_it(tmp_path):
    """algo=ppo in mode=disagg (async, max_staleness=1): the critic lives in the Ray training actor with
    the policy, its values are the trainer's at train time, it is checkpointed with the policy and a
    second life continues it (the AdamW step count carries on: a fresh critic would restart at 1)."""
    run_dir = tmp_path / "run"
    for total in (2, 4):
        out = run_cli(train_args(run_dir, "algo=ppo", f"total_steps={total}"), cwd=tmp_path, env=ENV, check=False)
        assert out.returncode == 0, out.stderr[-4000:]
        ckpt = run_dir / "checkpoints" / f"step_{total:08d}"
        assert (ckpt / "backend" / "critic" / "critic.safetensors").is_file()
        assert critic_updates(ckpt) == {total}
    check_ledger(run_dir, 4)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert all(k in r and r[k] == r[k] for k in ("critic/value_loss", "critic/vf_explained_var",
                                                     "critic/values_mean", "critic/grad_norm")), r
        assert r["staleness/max"] <= MAX_STALENESS
