"""A mixed run disaggregated (engines and trainer as Ray actors, concurrently): the ledger proves the split."""

from __future__ import annotations

import pytest

from rlharness.logging_utils.ledger import read_ledger
from tests.helpers import HANG_S, run_cli
from tests.multitask.mix_ledger import check_mix_ledger

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_TRAIN = {"padded": 8, "unpadded": 3}


@pytest.mark.timeout(HANG_S + 60)
def test_disagg_mixed_run_trains_each_step_its_allocation_and_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    args = ["experiment=arith_mix", "mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=1",
            "strategy.over_sample_threshold=0.5", "strategy.enable_partial_rollout=true", "batch_size=4",
            "sampler.prompt_repeat_k=4", "eval_every=0", "eval.num_prompts=8", "logger=none", "save_every=2",
            "total_steps=6", f"hydra.run.dir={run_dir}", "tasks.unpadded.max_staleness=0",
            *(f"tasks.{t}.task.num_train={n}" for t, n in NUM_TRAIN.items())]
    env = {"RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    out = run_cli(args, cwd=tmp_path, env=env, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    check_mix_ledger(run_dir, 6, 4, {"padded": 0.7, "unpadded": 0.3}, NUM_TRAIN)
    trained, _ = read_ledger(run_dir)
    for r in trained:  # each task within its own bound (the run's 1, unpadded's 0)
        bound = {"padded": 1, "unpadded": 0}[r["task"]]
        assert r["max_staleness"] == bound and r["train_step"] - 1 - r["min_policy_version"] <= bound, r
