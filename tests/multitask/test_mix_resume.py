"""A mixed run SIGKILLed at named points (drawn from a seed) and resumed trains exactly like the run left alone (sync)."""

from __future__ import annotations

import pytest

from rlharness.core.checkpoint import CheckpointError
from rlharness.logging_utils.ledger import read_ledger
from rlharness.producer.progress import BatchAllocation
from tests.helpers import run_in_process
from tests.resume.test_kill_resume import SYNC, assert_trains_like, kill_and_resume_until_done, run_to_the_end


MIX = [*SYNC, "experiment=arith_mix", "tasks.unpadded.task.num_train=9"]  # 8 steps x ~2.4 groups: 2+ epochs


def per_task_prompts(run_dir) -> dict[tuple[int, str], list[tuple[int, int]]]:
    trained, _ = read_ledger(run_dir)
    out: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for r in trained:
        out.setdefault((r["train_step"], r["task"]), []).append((r["epoch"], r["prompt_index"]))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sync_mixed_run_killed_and_resumed_matches_the_uninterrupted_one(tmp_path):
    reference = tmp_path / "reference"
    run_to_the_end(reference, MIX)
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    kill_and_resume_until_done(killed_dir, MIX, kills=2, seed=3, kill_in_checkpoint_step=3)  # every life dies where told
    want = per_task_prompts(reference)
    assert {t for _, t in want} == {"padded", "unpadded"}
    assert any(e > 0 for (_, t), ps in want.items() if t == "unpadded" for e, _ in ps)  # rolled over
    assert_trains_like(killed_dir, reference, total_steps=8)  # per task: the samples carry their task


def test_resuming_with_another_set_of_tasks_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    base = ["experiment=arith_mix", "engine=sim", "backend=sim", "total_steps=2", "batch_size=4",
            "sampler.prompt_repeat_k=2", "eval_every=0", "eval.num_prompts=4", "logger.mode=disabled"]
    run_in_process(run_dir, base)
    with pytest.raises(CheckpointError, match=r"saved with tasks \['padded', 'unpadded'\], this run has "
                                         r"\['padded', 'sums'\]; missing here: unpadded; not in the checkpoint: sums"):
        run_in_process(run_dir, [*base, "total_steps=3", "~tasks.unpadded", "+task@tasks.sums.task=arithmetic"])


def test_resuming_with_other_weights_keeps_the_steps_trained_and_splits_the_rest_by_the_new_ones(tmp_path, caplog):
    """Three tasks; weights 0.5/0.3/0.2 for 4 steps, then resumed with 0.2/0.3/0.5 to step 8: steps 1-4
    keep the split they were trained with, steps 5-8 take the new shares (exact to within one group),
    and no prompt is lost or repeated. Another batch size is refused, naming it."""
    from tests.multitask.mix_ledger import check_mix_ledger
    from tests.multitask.test_mix_runs import BASE

    run_dir = tmp_path / "run"
    three = [*BASE, "+task@tasks.third.task=arithmetic", "tasks.third.task.num_train=11", "tasks.third.task.seed=9"]
    before = {"padded": 0.5, "unpadded": 0.3, "third": 0.2}
    after = {"padded": 0.2, "unpadded": 0.3, "third": 0.5}
    run_in_process(run_dir, [*three, "total_steps=4", *(f"tasks.{t}.weight={w}" for t, w in before.items())])
    run_in_process(run_dir, [*three, "total_steps=8", *(f"tasks.{t}.weight={w}" for t, w in after.items())])
    assert "this run's {'padded': 0.2, 'unpadded': 0.3, 'third': 0.5} apply from train step 5" in caplog.text
    alloc = check_mix_ledger(run_dir, 8, 5, after, {"padded": 20, "unpadded": 7, "third": 11},
                             whole_run_share=False)
    assert [alloc.sizes(s) for s in range(1, 5)] == [BatchAllocation(5, before).sizes(s) for s in range(1, 5)]
    new_steps = {t: alloc.cumulative(8)[t] - alloc.cumulative(4)[t] for t in after}
    for t, w in after.items():
        assert abs(new_steps[t] - 4 * 5 * w) < 1, (t, new_steps)
    with pytest.raises(CheckpointError, match="the checkpoint's task mix is batch_size=5.*this run has batch_size=6"):
        run_in_process(run_dir, [*three, "total_steps=9", "batch_size=6"])
