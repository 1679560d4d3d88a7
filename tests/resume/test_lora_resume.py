"""LoRA runs resume exactly like full-weight runs: killed and resumed = left alone (PEFT-format checkpoints)."""

from __future__ import annotations

import json

import pytest

from rlharness.core.checkpoint import latest_checkpoint
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.resume.test_kill_resume import SYNC, assert_trains_like, kill_and_resume_until_done, run_to_the_end

pytestmark = [pytest.mark.slow]

# sync=adapter and a KL term: the engine applies the adapter, the reference is the adapters switched off.
LORA = [*SYNC, "model.lora.rank=4", "model.lora.sync=adapter", "algo.kl_coef=0.05", "algo.lr=3e-3"]


@pytest.mark.timeout(900)
def test_lora_killed_run_trains_exactly_like_the_uninterrupted_one(tmp_path):
    reference = tmp_path / "reference"
    run_to_the_end(reference, LORA)
    _, ckpt = latest_checkpoint(reference)
    saved = json.loads((ckpt / "backend" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and not (ckpt / "backend" / "model.safetensors").exists()
    rows = [r for r in read_metrics(RunDir(reference).metrics) if "train/loss" in r]
    assert rows[-1]["train/kl"] > 0  # the adapters moved the policy away from the base
    assert all(0 < r["perf/weight_sync_bytes"] < 100_000 for r in rows)  # adapters only (94 kB; the model is 2.1 MB)
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    kill_and_resume_until_done(killed_dir, LORA, kills=2, seed=3, kill_in_checkpoint_step=2)  # every life dies where told
    assert_trains_like(killed_dir, reference, total_steps=8)
