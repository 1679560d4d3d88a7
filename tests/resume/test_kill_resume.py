"""SIGKILL at named points drawn from a seed (inside a checkpoint write, mid-production, after an
optimizer step), resume each time.

sync: the same prompts in the same order with the same losses as the run left alone.
async: nothing lost, nothing trained twice (the rollouts/ ledger and the final
checkpoint's buffer account for every prompt drawn).
"""

from __future__ import annotations

import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from rlharness.core.checkpoint import latest_checkpoint, load_state
from rlharness.core.fault_points import signal_at
from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import CliProcess, start_cli

pytestmark = [pytest.mark.slow]

SYNC = ["total_steps=8", "save_every=1", "eval_every=0", "logger.mode=disabled", "batch_size=8",
        "sampler.prompt_repeat_k=4", "keep_checkpoints=2"]
ASYNC = ["engine=sim", "backend=sim", "strategy=async", "max_staleness=1", "strategy.over_sample_threshold=0.5",
         "strategy.enable_partial_rollout=true", "total_steps=40", "save_every=3", "eval_every=0",
         "logger.mode=disabled", "batch_size=8", "sampler.prompt_repeat_k=2", "engine.time_per_token_s=0.004",
         "engine.cv=1.5", "engine.mean_response_len=4"]


def launch(run_dir: Path, overrides: list[str], env_extra: dict | None = None) -> CliProcess:
    return start_cli([*overrides, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent,
                     env={"WANDB_MODE": "disabled", **(env_extra or {})})


def setting(overrides: list[str], key: str) -> int:
    return int(next(o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")))


def pick_point(rng: random.Random, overrides: list[str], done_steps: int) -> tuple[str, int]:
    """A named point (rlharness/core/fault_points.py) that a life resumed after `done_steps` reaches before
    it ends: a group put in the middle of its production, or one of its next steps trained. Where a
    life dies is drawn from the seed; that it dies there does not depend on the machine's speed."""
    left = min(2, setting(overrides, "total_steps") - done_steps)  # every step trained puts a batch first
    if rng.random() < 0.5:
        return "group_put", rng.randint(1, left * setting(overrides, "batch_size"))
    return "step_trained", done_steps + rng.randint(1, left)


def kill_and_resume_until_done(run_dir: Path, overrides: list[str], kills: int, seed: int,
                               kill_in_checkpoint_step: int) -> None:
    """Run to completion: SIGKILLed first inside a checkpoint's write, then `kills` more times at named
    points drawn from the seed, each life resuming the last; every life dies where it was told to."""
    rng = random.Random(seed)
    for life in range(kills + 1):
        done = latest_checkpoint(run_dir)
        point, number = (("checkpoint", kill_in_checkpoint_step) if life == 0
                         else pick_point(rng, overrides, done[0] if done else 0))
        proc = launch(run_dir, overrides, signal_at(signal.SIGKILL, point, number))
        assert proc.wait(timeout=600) == -signal.SIGKILL, (life, point, number, proc.stderr_text()[-2000:])
        if point == "checkpoint":
            assert list(RunDir(run_dir).checkpoints.glob(".tmp-*")), "the kill should leave a half-written checkpoint"
    proc = launch(run_dir, overrides)
    assert proc.wait(timeout=600) == 0, proc.stderr_text()[-3000:]


def run_to_the_end(run_dir: Path, overrides: list[str]) -> None:
    """The run left alone, as a process of its own like the interrupted one's lives."""
    run_dir.mkdir()
    proc = launch(run_dir, overrides)
    assert proc.wait(timeout=600) == 0, proc.stderr_text()[-3000:]


def trained_samples(run_dir: Path) -> dict[int, list[tuple]]:
    """Per step, every trained sample: its task, prompt draw, response and reward."""
    trained, _ = read_ledger(run_dir)
    by_step: dict[int, list[tuple]] = {}
    for r in trained:
        by_step.setdefault(r["train_step"], []).append(
            (r["task"], r["epoch"], r["prompt_index"], r["response"], r["reward"]))
    return {k: sorted(v) for k, v in by_step.items()}


# What a step's row is compared on when the loss differs: how far the engine's log-probs were
# from the trainer's (a weight mismatch shows here), and the step's inputs.
DIAGNOSTIC_KEYS = ("train/loss", "train/logprob_diff_rollout", "train/grad_norm", "train/entropy",
                   "train/response_tokens", "rollout/reward_mean", "train/lr")


def step_rows(run_dir: Path) -> dict[int, dict]:
    """The training rows of metrics.jsonl by step."""
    return {r["step"]: r for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r}


def assert_trains_like(run_dir: Path, reference: Path, total_steps: int) -> None:
    """Step for step the same samples (prompts, responses, rewards) and the same loss."""
    assert trained_samples(run_dir) == trained_samples(reference)
    ref, got = step_rows(reference), step_rows(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, total_steps + 1))
    for step, r in ref.items():
        why = {k: (got[step].get(k), r.get(k)) for k in DIAGNOSTIC_KEYS}
        assert got[step]["train/loss"] == pytest.approx(r["train/loss"], rel=1e-4, abs=1e-6), (step, why)


@pytest.mark.timeout(900)
def test_sync_killed_run_trains_exactly_like_the_uninterrupted_one(tmp_path, sync_reference_run):
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    kill_and_resume_until_done(killed_dir, SYNC, kills=3, seed=0, kill_in_checkpoint_step=2)
    assert_trains_like(killed_dir, sync_reference_run, total_steps=8)


@pytest.mark.timeout(900)
def test_async_killed_run_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "async"
    run_dir.mkdir()
    kill_and_resume_until_done(run_dir, ASYNC, kills=3, seed=1, kill_in_checkpoint_step=3)
    assert_nothing_lost_or_duplicated(run_dir, total_steps=40, max_staleness=1)


def assert_nothing_lost_or_duplicated(run_dir: Path, total_steps: int, max_staleness: int) -> None:
    """Every step trained once; every group drawn is trained, dropped or in the final checkpoint's buffer, once."""
    trained, dropped = read_ledger(run_dir)
    assert sorted({r["train_step"] for r in trained}) == list(range(1, total_steps + 1))
    # Each group is one (epoch, prompt) draw; no group appears twice anywhere.
    trained_groups = {(r["epoch"], r["prompt_index"]) for r in trained}
    dropped_groups = {(r["epoch"], r["prompt_index"]) for r in dropped}
    per_group = Counter((r["epoch"], r["prompt_index"], r["group_id"]) for r in trained)
    assert len({g[:2] for g in per_group}) == len(per_group), "a prompt was trained twice"
    assert not trained_groups & dropped_groups, "a prompt was both trained and dropped"
    for r in trained:
        assert r["train_step"] - 1 - r["min_policy_version"] <= max_staleness
    _, ckpt = latest_checkpoint(run_dir)
    state = load_state(ckpt / "trainer.pt")["producer"]
    buffered = {(g["epoch"], g["prompt_index"]) for g in _buffer_groups(state["replay_buffer"])}
    assert not buffered & (trained_groups | dropped_groups)
    drawn = sum(s["drawn"] for s in state["samplers"].values())
    assert len(trained_groups) + len(dropped_groups) + len(buffered) == drawn


def _buffer_groups(buffer_state) -> list[dict]:
    """Groups held in a saved ReplayBuffer state (`Group.to_dict`), in flight ones included (saved as ABORTED)."""
    return list(buffer_state["groups"]) + list(buffer_state["dropped"])
