"""LoRA in whole runs (in-process): colocated async with several tasks, and the real pretrained model."""

from __future__ import annotations

import pytest

from rlharness.logging_utils.metrics import read_metrics
from rlharness.model.load import PROJECT_ROOT
from rlharness.core.run_dir import RunDir
from tests.helpers import QUICK, run_in_process


def train_rows(run_dir) -> list[dict]:
    return [r for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r]


@pytest.mark.timeout(400)
def test_colocated_async_multitask_lora(tmp_path):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*QUICK, "experiment=arith_mix", "strategy=async", "max_staleness=1", "total_steps=3",
                             "eval_every=0", "save_every=0", "model.lora.rank=4", "algo.lr=3e-3"])
    rows = train_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    full_bytes = (PROJECT_ROOT / "assets" / "tiny-arith" / "model.safetensors").stat().st_size
    # The first sync sends everything once, later ones the merged projections only.
    assert rows[0]["perf/weight_sync_bytes"] > rows[1]["perf/weight_sync_bytes"] > 0
    assert rows[1]["perf/weight_sync_bytes"] < full_bytes
    assert {"rollout/padded/num_groups", "rollout/unpadded/num_groups"} <= set(rows[-1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_lora_adapter_run(smollm2, tmp_path):
    """The real model: 2.4M adapter parameters of 137M, the engine serves the adapter, KL against adapters off."""
    run_dir = tmp_path / "run"
    run_in_process(run_dir, ["experiment=chat_math", f"model.path={smollm2}",  # after the experiment: it sets a path
                             "batch_size=2", "sampler.prompt_repeat_k=2",
                             "agent.sampling.max_tokens=8", "total_steps=2", "eval_every=0", "save_every=0",
                             "eval.num_prompts=2", "logger.mode=disabled", "model.lora.rank=8",
                             "model.lora.sync=adapter", "algo.kl_coef=0.05", "algo.lr=1e-3"])
    rows = train_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/logprob_diff_rollout"] < 1e-3 for r in rows)
    adapter = RunDir(run_dir).checkpoint(2) / "backend" / "adapter_model.safetensors"
    assert 9e6 < adapter.stat().st_size < 11e6  # rank 8 on the 7 projections: 2.44M fp32 parameters
