"""Mixed runs (real producer; simulated engine and trainer for speed): the ledger proves the split.

Small datasets make every task roll over into new epochs within the run.
"""

from __future__ import annotations

import pytest

from rlharness.producer.progress import BatchAllocation
from rlharness.core.run_dir import RunDir
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
    assert (RunDir(run_dir).plots / "eval_accuracy.png").exists()


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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rollover", [True, False])
def test_a_task_with_fewer_prompts_than_its_share_rolls_over_or_leaves(tmp_path, caplog, rollover):
    """One prompt for a task whose share is 1-2 groups a step: with roll-over every step still gets
    its allocation (epochs within a step); without, it trains its one prompt at step 1 and leaves."""
    run_dir = tmp_path / "run"
    num_train = {**NUM_TRAIN, "unpadded": 1}
    run_in_process(run_dir, [*BASE, "total_steps=4", "tasks.unpadded.task.num_train=1",
                             f"tasks.unpadded.allow_epoch_rollover={str(rollover).lower()}"])
    alloc = check_mix_ledger(run_dir, 4, BATCH, WEIGHTS, num_train, whole_run_share=rollover)
    if rollover:
        assert not alloc.left and "holds some prompts more than once" in caplog.text
        assert producer_state(run_dir)["samplers"]["unpadded"]["epoch"] >= 5
    else:
        assert alloc.left == {"unpadded": 2} and alloc.sizes(1)["unpadded"] == 1
        assert "task unpadded: data exhausted (no epoch roll-over); it leaves the mix from train step 2" in caplog.text


@pytest.mark.timeout(300)
def test_a_task_with_its_own_agent_loop_and_one_without_eval_split(tmp_path):
    """padded runs the tool loop, unpadded the run's single-turn loop and has no eval split: it is
    trained (its share), not evaluated; eval/accuracy is the mean over the tasks evaluated."""
    from rlharness.logging_utils.ledger import read_ledger

    run_dir = tmp_path / "run"
    last = run_in_process(run_dir, [*BASE, "total_steps=2", "tasks.unpadded.task.num_eval=0",
                                    "+agent@tasks.padded.agent=multi_turn_tool"])
    check_mix_ledger(run_dir, 2, BATCH, WEIGHTS, NUM_TRAIN)
    trained, _ = read_ledger(run_dir)
    assert {r["task"] for r in trained if "turns" in r} == {"padded"}
    assert {r["task"] for r in trained if "turns" not in r} == {"unpadded"}
    assert "eval/padded/accuracy" in last and not any(k.startswith("eval/unpadded/") for k in last)
    assert last["eval/accuracy"] == last["eval/padded/accuracy"]  # the mean over the tasks evaluated
