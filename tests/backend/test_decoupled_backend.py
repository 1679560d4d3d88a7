"""The decoupled objective (algo.proximal) in real train steps of `backend=torch` on the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
import torch

from .test_torch_backend import backend, make_batch

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("proximal", ["recompute", "loglinear", "behaviour"])
def test_every_proximal_trains_with_every_estimator_and_aggregation(tiny_model_dir, proximal):
    b = backend(tiny_model_dir, proximal=proximal, mini_batches=2, micro_batch_size=3, lr=3e-3)
    for advantage, loss_agg in (("grpo", "token_mean"), ("drgrpo", "seq_mean_token_sum_norm"),
                                ("rloo", "seq_mean_token_mean"), ("reinforce_pp", "token_mean")):
        b.algo = dataclasses.replace(b.algo, advantage=advantage, loss_agg=loss_agg)
        before = {k: v.clone() for k, v in b.model.state_dict().items()}
        batch = make_batch(b.algo)
        batch.model_steps[batch.response_mask > 0] = 0
        batch.train_step = 3  # tokens two versions stale
        metrics = asyncio.run(b.train_step(batch))
        assert metrics["train/num_updates"] == 2
        assert all(math.isfinite(v) for v in metrics.values()), (advantage, loss_agg, metrics)
        assert any(not torch.equal(before[k], v) for k, v in b.model.state_dict().items())


def test_default_proximal_is_todays_objective(tiny_model_dir):
    """recompute with one update per step is the loss as it was (the clip against the step's own weights)."""
    results = []
    for proximal in ("recompute", "loglinear"):  # exact before the first update: the same numbers
        b = backend(tiny_model_dir, proximal=proximal, lr=3e-3)
        results.append((asyncio.run(b.train_step(make_batch(b.algo))), b.model.state_dict()))
    (m1, w1), (m2, w2) = results
    assert m1["train/loss"] == m2["train/loss"]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
