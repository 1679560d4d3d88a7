"""Per-task staleness bounds (`tasks.<name>.max_staleness`) and over-sampling
(`tasks.<name>.over_sample_threshold`): the ledger shows each task's bound held.

A two-task async run (real producer; simulated engine and trainer) with bounds 0 and 2, in both
staleness modes: token mode bounds every trained token's staleness, admission mode the staleness
each group was admitted at. The looser task must actually use its room (else the test shows nothing).
"""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError
from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import compose_conf, run_in_process
from tests.multitask.mix_ledger import check_mix_ledger
from tests.multitask.test_mix_runs import BASE, BATCH, NUM_TRAIN, STEPS, WEIGHTS

BOUNDS = {"padded": 2, "unpadded": 0}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["token", "admission"])
def test_each_task_s_samples_respect_its_own_staleness_bound(tmp_path, mode):
    run_dir = tmp_path / mode
    # Token mode: the tight task also over-samples nothing (its own threshold), the other a whole batch.
    own_over_sampling = ["tasks.unpadded.over_sample_threshold=0"] if mode == "token" else []
    last = run_in_process(run_dir, [
        *BASE, "strategy=async", "max_staleness=2", "tasks.unpadded.max_staleness=0",
        f"strategy.staleness_mode={mode}", "strategy.over_sample_threshold=1.0",
        "strategy.enable_partial_rollout=true", *own_over_sampling])
    check_mix_ledger(run_dir, STEPS, BATCH, WEIGHTS, NUM_TRAIN)
    trained, _ = read_ledger(run_dir)
    worst = {t: 0 for t in BOUNDS}
    for r in trained:
        bound = BOUNDS[r["task"]]
        assert r["max_staleness"] == bound, r
        token = r["train_step"] - 1 - r["min_policy_version"]
        admitted = r["admit_step"] - 1 - r["admit_version"]
        held = token if mode == "token" else admitted
        assert 0 <= held <= bound, (r["task"], r["train_step"], held)
        worst[r["task"]] = max(worst[r["task"]], held)
    assert worst["padded"] > 0, "the task with bound 2 never used it: the test would show nothing"
    assert last["staleness/unpadded/max" if mode == "token" else "staleness/unpadded/admission_max"] == 0
    rows = [r for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r]
    generated = {t: sum(r[f"rollout/{t}/groups_generated"] for r in rows) for t in BOUNDS}
    trained_groups = {t: len({r["group_id"] for r in trained if r["task"] == t}) for t in BOUNDS}
    assert generated["padded"] > trained_groups["padded"]  # over-sampled (and continued) groups
    if mode == "token":  # no over-sampling: every group generated was trained, at once
        assert generated["unpadded"] == trained_groups["unpadded"], (generated, trained_groups)


@pytest.mark.parametrize("value,message", [
    (3, "tasks.unpadded.max_staleness=3 is not allowed: expected null \\(the run's\\) or an integer from 0 to "
        "the run's max_staleness=2"),
    (-1, "tasks.unpadded.max_staleness=-1 is not allowed"),
])
def test_a_task_bound_outside_the_run_s_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message):
        compose_conf(["experiment=arith_mix", "max_staleness=2", f"tasks.unpadded.max_staleness={value}"])
    conf, _ = compose_conf(["experiment=arith_mix", "max_staleness=2", "tasks.unpadded.max_staleness=1"])
    from rlharness.launch.build import staleness_policy

    policy = staleness_policy(conf)
    assert [policy.bound(name) for name in conf.task_entries()] == [2, 1]


def test_the_run_builds_one_staleness_policy_that_every_part_asks(tmp_path):
    """The bounds, the sync interval and the mode reach the buffer, strategy, contexts and manager as
    one object (producer/staleness.py), so no part can hold a threshold of its own."""
    from rlharness.launch.build import build_components

    conf, _ = compose_conf([*BASE, "strategy=async", "max_staleness=2", "tasks.unpadded.max_staleness=0",
                            "sync_weights_interval=2", "strategy.staleness_mode=admission"], tmp_path)
    manager = build_components(conf).manager
    policy = manager.replay_buffer.staleness
    assert (policy.max_staleness, policy.sync_weights_interval, policy.mode) == (2, 2, "admission")
    assert dict(policy.task_bounds) == {"unpadded": 0}
    assert (policy.threshold("padded"), policy.threshold("unpadded")) == (6, 2)  # (bound + 1) * interval
    assert manager.staleness is policy and manager.strategy.staleness is policy
    assert all(c.staleness is policy for c in manager.contexts.values())
