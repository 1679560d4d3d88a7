"""Real runs, in-process: every file of the run directory, learning signals, staleness."""

from __future__ import annotations

import logging
import math
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import QUICK, ROOT, run_in_process

REQUIRED_METRICS = [
    "step", "train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/clip_frac",
    "rollout/reward_mean", "rollout/response_len_mean", "rollout/groups_filtered", "rollout/groups_failed",
    "rollout/groups_aborted", "staleness/mean", "staleness/max", "buffer/expired", "perf/step_s",
    "perf/rollout_s", "perf/train_s", "perf/weight_sync_s", "perf/tokens_per_s", "perf/engine_busy_frac",
]
LEDGER_KEYS = ["uid", "group_id", "task", "prompt_index", "epoch", "train_step", "min_policy_version",
               "max_policy_version", "status", "reward", "response_len", "prompt", "response"]


def check_run_dir(run_dir, total_steps, log_text):
    """`log_text`: what the run logged (caplog's text: an in-process run has no Hydra train.log)."""
    rows = read_metrics(RunDir(run_dir).metrics)
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == list(range(1, total_steps + 1))
    for key in REQUIRED_METRICS:
        assert key in rows[-1], key
    assert any("eval/accuracy" in r for r in rows)
    trained, _ = read_ledger(run_dir)
    assert {r["train_step"] for r in trained} == set(range(1, total_steps + 1))
    for key in LEDGER_KEYS:
        assert key in trained[0], key
    ckpt = RunDir(run_dir).checkpoint(total_steps)
    assert (ckpt / "DONE").is_file()
    assert list(RunDir(run_dir).plots.glob("*.png"))
    # What train.log holds in a CLI run: the final checkpoint's line and the run directory.
    assert f"checkpoint saved: {ckpt}" in log_text
    assert f"run directory: {run_dir}" in log_text
    return rows, trained


@pytest.mark.timeout(300)
def test_real_tiny_model_trains_and_writes_everything(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    # The embedded default model: it gets some answers right, so groups carry signal.
    run_dir = tmp_path / "run"
    steps = 3
    run_in_process(run_dir, [*QUICK, "batch_size=16", "sampler.prompt_repeat_k=8", f"total_steps={steps}",
                             "eval_every=2", "save_every=2", "logger.mode=offline"])
    rows, trained = check_run_dir(run_dir, steps, caplog.text)
    for r in rows:
        if "train/loss" in r:
            assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
    # Weights changed and the engine was given them: versions 0..steps-1 produced the tokens.
    before = load_file(ROOT / "assets" / "tiny-arith" / "model.safetensors")
    after = load_file(RunDir(run_dir).checkpoint(steps) / "backend" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    versions = {(r["train_step"], r["max_policy_version"]) for r in trained}
    assert all(v == step - 1 for step, v in versions)  # sync colocate: on-policy, engine got step-1
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_sim_async_respects_the_staleness_bound_and_loses_nothing(tmp_path, staleness, caplog):
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / f"s{staleness}"
    steps = 12
    manager_stats = run_in_process(run_dir, [
        "engine=sim", "backend=sim", "strategy=async", f"max_staleness={staleness}",
        "strategy.over_sample_threshold=0.5", "strategy.enable_partial_rollout=true",
        f"total_steps={steps}", "eval_every=0", "save_every=5", "batch_size=16", "logger.mode=disabled",
        "engine.cv=1.5", "engine.time_per_token_s=0.0005"])
    assert manager_stats
    rows, trained = check_run_dir(run_dir, steps, caplog.text)
    for r in trained:
        assert r["train_step"] - 1 - r["min_policy_version"] <= staleness
    # No prompt trained twice within an epoch.
    seen = Counter((r["epoch"], r["prompt_index"]) for r in trained if r["uid"])
    groups_per_prompt = Counter()
    for r in trained:
        groups_per_prompt[(r["epoch"], r["prompt_index"], r["group_id"])] += 1
    assert len({(e, p) for e, p, _ in groups_per_prompt}) == len(groups_per_prompt)
    assert seen  # non-empty
