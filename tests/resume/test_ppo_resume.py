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

from rlharness.core.checkpoint import latest_checkpoint
from tests.helpers import HANG_S
from tests.resume.test_kill_resume import launch, step_rows, trained_samples

pytestmark = [pytest.mark.timeout(3 * HANG_S)]  # three runs, each bounded by HANG_S

# A constant LR: the second life extends total_steps, which would re-plan a decaying schedule.
PPO = ["algo=ppo", "algo.lr_schedule=constant", "algo.critic.warmup_steps=1", "save_every=2", "eval_every=0",
       "logger.mode=disabled", "batch_size=8", "sampler.prompt_repeat_k=4"]
COMPARED = ("train/loss", "train/grad_norm", "critic/value_loss", "critic/grad_norm", "critic/values_mean",
            "critic/returns_mean", "critic/vf_explained_var", "rollout/reward_mean")


def run(run_dir: Path, overrides: list[str]) -> None:
    run_dir.mkdir(exist_ok=True)
    proc = launch(run_dir, overrides)
    assert proc.wait(timeout=HANG_S) == 0, proc.stderr_text()[-3000:]


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


@pytest.mark.ray
@pytest.mark.deepspeed
@pytest.mark.slow
def test_deepspeed_ppo_resumes_its_critic_and_trains_the_step_again_alike(tmp_path):
    """backend=deepspeed (2 ZeRO-2 ranks): step 3 trained again from the step-2 checkpoint (the step-3
    one moved away, as if the run had died before writing it) gives step 3's samples, losses and critic
    metrics, and the critic's weights, of the first time."""
    import shutil

    run_dir = tmp_path / "run"
    args = [*(o for o in PPO if not o.startswith(("batch_size=", "save_every="))), "batch_size=4", "save_every=1",
            "backend=deepspeed", "cluster=local_ray", "keep_checkpoints=3", "total_steps=3"]
    run(run_dir, args)
    first_samples, first_rows = trained_samples(run_dir), step_rows(run_dir)
    shutil.move(run_dir / "checkpoints" / "step_00000003", tmp_path / "step_3_first")
    run(run_dir, args)  # resumes from step 2
    assert trained_samples(run_dir) == first_samples
    got = step_rows(run_dir)
    for k in COMPARED:
        assert got[3][k] == pytest.approx(first_rows[3][k], rel=1e-4, abs=1e-6), (k, got[3][k], first_rows[3][k])
    assert (run_dir / "checkpoints" / "step_00000003" / "backend" / "critic" / "deepspeed").is_dir()
    a, b = (load_file(str(d / "backend" / "critic" / "critic.safetensors"))
            for d in (tmp_path / "step_3_first", run_dir / "checkpoints" / "step_00000003"))
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff <= 2 * 3e-4, diff  # one update after the resume (see above); a fresh critic is ~1e-2 away
