"""algo=ppo resumed from its run directory trains as the run left alone: policy and critic.

Exact but for float rounding: as in the kill tests (`assert_trains_like`), a resumed life's engine
may admit the step's groups in another pattern, which moves rollout log-probs by ~1e-7 and so
the PPO ratio, the loss and the gradient in their last digits (seen once in CI-like load: loss
-3.87e-8 vs -4.19e-8, grad norm equal to 7 digits). A critic or optimizer not restored moves
them by orders of magnitude more."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlharness.checkpoint import latest_checkpoint
from tests.resume.test_kill_resume import launch, step_rows, trained_samples

pytestmark = [pytest.mark.timeout(600)]

# A constant LR: the second life extends total_steps, which would re-plan a decaying schedule.
PPO = ["algo=ppo", "algo.lr_schedule=constant", "algo.critic.warmup_steps=1", "save_every=2", "eval_every=0",
       "logger.mode=disabled", "batch_size=8", "sampler.prompt_repeat_k=4"]
COMPARED = ("train/loss", "train/grad_norm", "critic/value_loss", "critic/grad_norm", "critic/values_mean",
            "critic/returns_mean", "critic/vf_explained_var", "rollout/reward_mean")


def run(run_dir: Path, overrides: list[str]) -> None:
    run_dir.mkdir(exist_ok=True)
    proc = launch(run_dir, overrides)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-3000:]


def test_ppo_resume_trains_as_the_run_left_alone(tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run(reference, [*PPO, "total_steps=4"])
    run(resumed, [*PPO, "total_steps=2"])
    run(resumed, [*PPO, "total_steps=4"])  # the same directory: a resume from step 2
    assert trained_samples(resumed) == trained_samples(reference)
    ref, got = step_rows(reference), step_rows(resumed)
    assert sorted(got) == sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        for k in COMPARED:
            assert got[step][k] == pytest.approx(ref[step][k], rel=1e-4, abs=1e-6), (step, k, got[step][k], ref[step][k])
    assert ref[1]["train/num_updates"] == 0 and ref[3]["train/num_updates"] == 1  # critic warmup: step 1
    final = [latest_checkpoint(d)[1] / "backend" for d in (reference, resumed)]
    for name in ("model.safetensors", "critic/critic.safetensors"):
        a, b = (load_file(str(f / name)) for f in final)
        assert a.keys() == b.keys(), name
        diff = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
        # Adam can turn a rounding difference of a near-zero gradient into up to 2 LRs per update
        # (2 updates after the resume); almost every weight agrees to 1e-6.
        assert float(diff.max()) <= 4 * 3e-4 and float((diff > 1e-6).float().mean()) < 0.01, (name, float(diff.max()))
