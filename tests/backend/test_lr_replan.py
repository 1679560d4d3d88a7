"""Extending a run re-plans the rest of the LR schedule from the current LR (rlharness/backend/lr_plan.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlharness.backend.lr_plan import LRPlan, planned, replan
from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf
from tests.backend.test_torch_backend import make_batch

pytestmark = pytest.mark.timeout(180)


def algo(**kw) -> AlgoConf:
    return AlgoConf(name="test", **{"lr": 1e-3, "lr_schedule": "cosine", "min_lr_ratio": 0.1, **kw})


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_extension_continues_from_the_current_lr_down_to_the_floor(schedule):
    a = algo(lr_schedule=schedule, warmup_steps=2)
    old = LRPlan(total_steps=10)
    current = planned(6, old, a)
    new, message = replan(old.state_dict(), 6, 20, current, a)
    assert message and "total_steps=20" in message and "was 10" in message
    curve = [planned(s, new, a) for s in range(6, 21)]
    assert curve[0] == pytest.approx(current)  # no jump back to the peak
    assert all(x >= y - 1e-12 for x, y in zip(curve, curve[1:]))  # keeps decaying
    assert curve[-1] == pytest.approx(0.1)
    # Resuming the extended run again (same total_steps) keeps that curve exactly.
    again, message = replan(new.state_dict(), 11, 20, planned(11, new, a), a)
    assert message is None and [planned(s, again, a) for s in range(11, 21)] == curve[5:]


def test_no_replan_when_the_length_is_unchanged_or_nothing_has_decayed():
    a = algo(warmup_steps=5)
    plan = LRPlan(total_steps=10)
    assert replan(plan.state_dict(), 4, 10, planned(4, plan, a), a) == (plan, None)
    new, _ = replan(plan.state_dict(), 3, 20, planned(3, plan, a), a)  # still warming up: decay over 20
    assert new == LRPlan(total_steps=20)
    # A finished run extended stays at its floor.
    finished, _ = replan(plan.state_dict(), 10, 30, planned(10, plan, a), a)
    assert [planned(s, finished, a) for s in (10, 20, 30)] == pytest.approx([0.1, 0.1, 0.1])


def test_checkpoint_without_a_saved_plan_is_judged_by_its_current_lr():
    a = algo()
    new, message = replan(None, 5, 20, planned(5, LRPlan(10), a), a)
    assert message and planned(5, new, a) == pytest.approx(planned(5, LRPlan(10), a))
    assert replan(None, 5, 20, planned(5, LRPlan(20), a), a) == (LRPlan(20), None)


def test_torch_backend_resumed_with_more_steps_does_not_restart_the_schedule(tiny_model_dir, tmp_path, caplog):
    a = algo()
    first = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), a, total_steps=4, seed=0)
    for i in range(4):
        asyncio.run(first.train_step(make_batch(a, seed=i)))
    lr_at_end = first.optimizer.param_groups[0]["lr"]
    assert lr_at_end == pytest.approx(1e-4)  # the floor of a finished 4-step cosine run
    first.save_blocking(str(tmp_path / "ckpt"))
    extended = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), a, total_steps=8, seed=0)
    with caplog.at_level(logging.INFO, logger="rlharness.backend.learner"):
        extended.load_blocking(str(tmp_path / "ckpt"))
    assert any("LR schedule re-planned for total_steps=8 (was 4)" in r.message for r in caplog.records)
    lrs = [asyncio.run(extended.train_step(make_batch(a, seed=9)))["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([lr_at_end] * 4)  # not back to 1e-3
