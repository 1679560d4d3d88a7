"""backend.micro_batch_tokens: rows grouped by a token budget train exactly the unsplit batch."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from rlharness.algo.losses import LOSS_AGG_MODES
from rlharness.backend.micro_batches import token_budget_slices
from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, ConfigError, DeepSpeedBackendConf, ModelConf, TorchBackendConf
from tests.backend.test_torch_backend import make_batch

pytestmark = pytest.mark.timeout(300)


def test_slices_respect_the_budget_longest_first():
    lengths = torch.tensor([3, 9, 4, 8, 2, 7])
    slices, oversized = token_budget_slices(torch.arange(6), lengths, budget=16)
    assert [s.tolist() for s in slices] == [[1], [3, 5], [2, 0, 4]]  # 9 | 8+7 (2x8) | 4,3,2 (3x4)
    assert oversized == 0
    for s in slices:
        assert len(s) * int(lengths[s].max()) <= 16
    slices, oversized = token_budget_slices(torch.tensor([10, 11, 12]), torch.tensor([5, 20, 5]), budget=10)
    assert [s.tolist() for s in slices] == [[11], [10, 12]] and oversized == 1  # too long: alone, not dropped


def backend(model_dir: str, algo: AlgoConf, budget: int | None) -> Learner:
    return Learner(TorchBackendConf(micro_batch_tokens=budget), ModelConf(path=model_dir), algo,
                        total_steps=10, seed=0)


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_token_budget_gives_the_unsplit_loss_and_gradient(tiny_model_dir, loss_agg, caplog):
    algo = AlgoConf(name="grpo", lr=1e-3, loss_agg=loss_agg, micro_batch_size=512, kl_coef=0.02)
    batch = make_batch(algo, seed=3, num_groups=4, k=4)
    whole, split = backend(tiny_model_dir, algo, None), backend(tiny_model_dir, algo, 24)
    lengths = batch.attention_mask.sum(-1)
    assert len(split._micro_slices(torch.arange(len(lengths)), batch.attention_mask)) >= 3
    with caplog.at_level(logging.WARNING):
        got, want = split.train_step_blocking(batch), whole.train_step_blocking(batch)
    assert "micro_batch_tokens" not in caplog.text  # every row fits the budget here
    # float32 sums in another order: the losses sum per-token terms of about |advantage| that mostly
    # cancel (here 0.015 from terms near 1), so their rounding is relative to the terms, not the sum
    # (AVX2 kernels: 1.7e-6 of the loss); a wrongly weighted micro-batch is off by far more.
    term_scale = float(batch.advantages[batch.response_mask.bool()].abs().mean())
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm",
                "train/response_tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-6 * term_scale), key
    # The gradient of the (single) update, left in .grad by the step: equal to 1e-6 relative.
    # (Not the updated weights: Adam turns float-rounding differences of near-zero gradients into
    # differences of up to the learning rate.)
    for (name, p), q in zip(split.model.named_parameters(), whole.model.parameters()):
        assert float((p.grad - q.grad).norm()) <= 1e-6 * float(q.grad.norm()) + 1e-12, name


def test_budget_below_the_longest_row_warns_once_and_trains_every_row(tiny_model_dir, caplog):
    algo = AlgoConf(name="grpo", lr=1e-3, mini_batches=2)
    batch = make_batch(algo, seed=4)
    tiny, whole = backend(tiny_model_dir, algo, 3), backend(tiny_model_dir, algo, None)
    with caplog.at_level(logging.WARNING):
        got = tiny.train_step_blocking(batch)
    assert caplog.text.count("backend.micro_batch_tokens=3 is below the longest row") == 1
    want = whole.train_step_blocking(batch)
    assert got["train/response_tokens"] == want["train/response_tokens"]
    # Every row alone: 16 float32 partial sums instead of one. Their rounding is 1e-7 of the terms'
    # size, not of this small difference of terms (7e-7 relative on 2 threads, 1.7e-6 on one).
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("conf", [TorchBackendConf(), DeepSpeedBackendConf()])
@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_budget_is_refused_by_key(conf, value):
    with pytest.raises(ConfigError, match=f"backend.micro_batch_tokens={value} is not allowed"):
        dataclasses.replace(conf, micro_batch_tokens=value)
