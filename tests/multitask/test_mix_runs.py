"""Mixed runs (real producer; simulated engine and trainer for speed): the ledger proves the split.

Small datasets make every task roll over into new epochs within the run.
"""

from __future__ import annotations

import pytest

from rlharness.producer.progress import BatchAllocation
from tests.helpers import run_in_process
from tests.multitask.mix_ledger import check_mix_ledger, producer_state

WEIGHTS = {"padded": 0.7, "unpadded": 0.3}
NUM_TRAIN = {"padded": 20, "unpadded": 7}
STEPS, BATCH = 12, 5
BASE = ["experiment=arith_mix", "engine=sim", "backend=sim", f"total_steps={STEPS}", f"batch_size={BATCH}",
        "sampler.prompt_repeat_k=2", "eval_every=0", "eval.num_prompts=8", "save_every=4", "logger.mode=disabled",
        "engine.mean_response_len=4", "engine.time_per_token_s=0.001", "engine.cv=1.5",
        *(f"tasks.{t}.task.num_train={n}" for t, n in NUM_TRAIN.items())]
ASYNC = ["strategy=async", "max_staleness=1", "strategy.over_sample_threshold=0.5",
         "strategy.enable_partial_rollout=true"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_step_trains_its_allocation_and_no_prompt_is_lost_or_repeated(tmp_path, mode):
    # Disaggregated mode (Ray actors): test_mix_disagg.py.
    run_dir = tmp_path / mode
    last = run_in_process(run_dir, [*BASE, *(ASYNC if mode == "async" else [])])
    check_mix_ledger(run_dir, STEPS, BATCH, WEIGHTS, NUM_TRAIN)
    for t in WEIGHTS:
        assert f"rollout/{t}/reward_mean" in last and f"eval/{t}/accuracy" in last
    assert last["eval/accuracy"] == pytest.approx(
        0.7 * last["eval/padded/accuracy"] + 0.3 * last["eval/unpadded/accuracy"])
    assert (run_dir / "plots" / "eval_accuracy.png").exists()


@pytest.mark.timeout(300)
def test_a_task_without_roll_over_leaves_the_mix_when_its_data_run_out(tmp_path, caplog):
    run_dir = tmp_path / "leave"
    run_in_process(run_dir, [*BASE, "tasks.unpadded.allow_epoch_rollover=false"])
    alloc = check_mix_ledger(run_dir, STEPS, BATCH, WEIGHTS, NUM_TRAIN)
    left = alloc.left["unpadded"]  # the first step its 7 prompts could not fill
    planned = BatchAllocation(BATCH, WEIGHTS).cumulative
    assert planned(left - 1)["unpadded"] <= NUM_TRAIN["unpadded"] < planned(left)["unpadded"]
    assert alloc.cumulative(left - 1) == planned(left - 1)  # the steps before are unchanged
    assert all(alloc.sizes(s) == {"padded": BATCH, "unpadded": 0} for s in range(left, STEPS + 1))
    assert producer_state(run_dir)["samplers"]["unpadded"]["epoch"] == 0
    assert "leaves the mix from train step" in caplog.text
