"""A mixed run SIGKILLed at random moments and resumed trains exactly like the run left alone (sync)."""

from __future__ import annotations

import pytest

from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from tests.helpers import run_in_process
from tests.resume.test_kill_resume import SYNC, kill_and_resume_until_done

pytestmark = [pytest.mark.slow]

MIX = [*SYNC, "experiment=arith_mix", "tasks.unpadded.task.num_train=9"]  # 8 steps x ~2.4 groups: 2+ epochs


def per_task_prompts(run_dir) -> dict[tuple[int, str], list[tuple[int, int]]]:
    trained, _ = read_ledger(run_dir)
    out: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for r in trained:
        out.setdefault((r["train_step"], r["task"]), []).append((r["epoch"], r["prompt_index"]))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.timeout(900)
def test_sync_mixed_run_killed_and_resumed_matches_the_uninterrupted_one(tmp_path):
    reference = tmp_path / "reference"
    run_in_process(reference, MIX)
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    assert kill_and_resume_until_done(killed_dir, MIX, kills=2, seed=3, kill_in_checkpoint_step=3) >= 2
    want = per_task_prompts(reference)
    assert {t for _, t in want} == {"padded", "unpadded"}
    assert any(e > 0 for (_, t), ps in want.items() if t == "unpadded" for e, _ in ps)  # rolled over
    assert per_task_prompts(killed_dir) == want
    ref = {r["step"]: r for r in read_metrics(reference / "metrics.jsonl") if "train/loss" in r}
    got = {r["step"]: r for r in read_metrics(killed_dir / "metrics.jsonl") if "train/loss" in r}
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    for step, r in ref.items():
        for task in ("padded", "unpadded"):
            assert got[step][f"rollout/{task}/reward_mean"] == r[f"rollout/{task}/reward_mean"], (step, task)
            assert got[step][f"rollout/{task}/num_groups"] == r[f"rollout/{task}/num_groups"], (step, task)
        assert got[step]["train/loss"] == pytest.approx(r["train/loss"], rel=1e-4, abs=1e-6), step


def test_resuming_with_another_set_of_tasks_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    base = ["experiment=arith_mix", "engine=sim", "backend=sim", "total_steps=2", "batch_size=4",
            "sampler.prompt_repeat_k=2", "eval_every=0", "eval.num_prompts=4", "logger.mode=disabled"]
    run_in_process(run_dir, base)
    with pytest.raises(ValueError, match=r"saved with tasks \['padded', 'unpadded'\], this run has "
                                         r"\['padded', 'sums'\]; missing here: unpadded; not in the checkpoint: sums"):
        run_in_process(run_dir, [*base, "total_steps=3", "~tasks.unpadded", "+task@tasks.sums.task=arithmetic"])
