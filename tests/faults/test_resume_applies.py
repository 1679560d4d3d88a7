"""A resume applies what it records (issue 22, item 4): a changed `algo.lr`, weight decay, betas or
LR-schedule shape takes effect from the resumed step and is logged; the checkpoint's optimizer and
scheduler state never silently bring back the first life's values."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlharness.backend.lr_plan import LRPlan, planned
from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf
from tests.backend.test_torch_backend import make_batch

pytestmark = pytest.mark.timeout(180)

FIRST = {"lr": 1e-3, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.99, "lr_schedule": "cosine",
         "warmup_steps": 0, "min_lr_ratio": 0.1}


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    """Two steps of a 6-step run with FIRST's settings, saved."""
    first = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), AlgoConf(name="t", **FIRST),
                         total_steps=6, seed=0)
    for i in range(2):
        asyncio.run(first.train_step(make_batch(first.algo, seed=i)))
    out = tmp_path_factory.mktemp("ckpt") / "backend"
    first.save_blocking(str(out))
    return str(out)


@pytest.mark.parametrize("change, logged", [
    ({"lr": 1e-4}, "algo.lr: 0.001 -> 0.0001"),
    ({"weight_decay": 0.05}, "algo.weight_decay: 0.0 -> 0.05"),
    ({"adam_beta1": 0.8, "adam_beta2": 0.95}, "algo.adam_beta1/2: 0.9, 0.99 -> 0.8, 0.95"),
    ({"lr_schedule": "constant"}, "the LR is 0.001"),
    ({"min_lr_ratio": 0.5}, "the checkpoint's was"),
    ({"warmup_steps": 4}, "the checkpoint's was"),
])
def test_a_changed_optimizer_setting_applies_from_the_resumed_step(tiny_model_dir, checkpoint, caplog, change,
                                                                   logged):
    algo = AlgoConf(name="t", **{**FIRST, **change})
    resumed = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), algo, total_steps=6, seed=0)
    with caplog.at_level(logging.INFO, logger="rlharness.backend.learner"):
        resumed.load_blocking(checkpoint)
    lines = [r.getMessage() for r in caplog.records if "resumed at step 2" in r.getMessage()]
    assert len(lines) == 1 and logged in lines[0], [r.getMessage() for r in caplog.records]
    group = resumed.optimizer.param_groups[0]
    assert group["weight_decay"] == algo.weight_decay
    assert tuple(group["betas"]) == (algo.adam_beta1, algo.adam_beta2)
    # The LR the resumed steps train with is this run's schedule at those steps, not the checkpoint's.
    lrs = [asyncio.run(resumed.train_step(make_batch(algo, seed=9 + i)))["train/lr"] for i in range(3)]
    assert lrs == pytest.approx([algo.lr * planned(s, LRPlan(6), algo) for s in (2, 3, 4)], rel=1e-9)


def test_an_unchanged_resume_logs_nothing_and_continues_exactly(tiny_model_dir, checkpoint, caplog):
    algo = AlgoConf(name="t", **FIRST)
    resumed = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), algo, total_steps=6, seed=0)
    with caplog.at_level(logging.INFO, logger="rlharness.backend.learner"):
        resumed.load_blocking(checkpoint)
    assert not [r for r in caplog.records if "resumed at step" in r.getMessage()]
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * planned(2, LRPlan(6), algo), rel=1e-12)
