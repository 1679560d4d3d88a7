"""algo=ppo resumed from its run directory trains exactly as the run left alone: policy and critic."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_ppo_resume_is_bit_exact(tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run(reference, [*PPO, "total_steps=4"])
    run(resumed, [*PPO, "total_steps=2"])
    run(resumed, [*PPO, "total_steps=4"])  # the same directory: a resume from step 2
    assert trained_samples(resumed) == trained_samples(reference)
    ref, got = step_rows(reference), step_rows(resumed)
    assert sorted(got) == sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        assert {k: got[step][k] for k in COMPARED} == {k: ref[step][k] for k in COMPARED}, step
    assert ref[1]["train/num_updates"] == 0 and ref[3]["train/num_updates"] == 1  # critic warmup: step 1
    final = [latest_checkpoint(d)[1] / "backend" for d in (reference, resumed)]
    for name in ("model.safetensors", "critic/critic.safetensors"):
        a, b = (load_file(str(f / name)) for f in final)
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), name
