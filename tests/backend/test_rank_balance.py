"""Balanced ranks (backend=deepspeed): Karmarkar-Karp shares, equal micro-batch counts, and the
rank plan trains every row once with the loss and gradient of the unsplit batch.

The DeepSpeed run itself (ranks as Ray actors) is in tests/distributed/test_deepspeed_backend.py;
here every rank's micro-batches run in one process, which sums the ranks' gradients as the
all-reduce does."""

from __future__ import annotations

import random

import pytest
import torch

from rlharness.algo.losses import LOSS_AGG_MODES
from rlharness.backend.packing import next_fit, row_width
from rlharness.backend.rank_balance import imbalance, karmarkar_karp, rank_micro_slices, rank_shares
from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf
from tests.backend.test_torch_backend import make_batch

pytestmark = pytest.mark.timeout(300)


def lognormal_lengths(n: int, seed: int, mean: float = 300.0, cv: float = 1.0) -> list[int]:
    sigma2 = torch.log(torch.tensor(1.0 + cv * cv))
    mu = float(torch.log(torch.tensor(mean)) - sigma2 / 2)
    g = torch.Generator().manual_seed(seed)
    return [max(1, int(x)) for x in torch.exp(mu + sigma2.sqrt() * torch.randn(n, generator=g))]


def sums(lengths: list[int], groups: list[list[int]]) -> list[float]:
    return [float(sum(lengths[i] for i in g)) for g in groups]


@pytest.mark.parametrize("parts", [2, 4])
def test_karmarkar_karp_balances_long_tailed_lengths(parts):
    for seed in range(5):
        lengths = lognormal_lengths(64, seed)
        groups = karmarkar_karp(lengths, parts)
        assert sorted(i for g in groups for i in g) == list(range(64))  # every row exactly once
        assert {len(g) for g in groups} == {64 // parts}  # equal row counts
        strided = [list(range(r, 64, parts)) for r in range(parts)]
        assert imbalance(sums(lengths, groups)) <= 1.05
        assert imbalance(sums(lengths, groups)) <= imbalance(sums(lengths, strided))


def test_karmarkar_karp_on_hard_cases():
    # Sorted lengths, strided: rank 0 always gets the longer of each pair.
    lengths = list(range(100, 0, -1))
    groups = karmarkar_karp(lengths, 2)
    assert sums(lengths, groups) == [2525.0, 2525.0]
    assert imbalance(sums(lengths, [list(range(0, 100, 2)), list(range(1, 100, 2))])) == pytest.approx(1.0099, 1e-3)
    # One huge row: the best is the huge row with the shortest others.
    lengths = [1000] + [10] * 7
    groups = karmarkar_karp(lengths, 4)
    big = next(g for g in groups if 0 in g)
    assert len(big) == 2 and sums(lengths, [big]) == [1010.0]
    # All equal; and as many parts as rows.
    assert imbalance(sums([7] * 12, karmarkar_karp([7] * 12, 3))) == 1.0
    assert sorted(map(sorted, karmarkar_karp([5, 1, 3], 3))) == [[0], [1], [2]]
    # Three 2-row parts from {9, 8, 7, 3, 2, 1}: perfect split is 10, 10, 10.
    assert sorted(sums([9, 8, 7, 3, 2, 1], karmarkar_karp([9, 8, 7, 3, 2, 1], 3))) == [10.0, 10.0, 10.0]
    with pytest.raises(ValueError, match="equal parts"):
        karmarkar_karp([1, 2, 3], 2)


@pytest.mark.parametrize("packed", [None, "dense", "varlen"])
@pytest.mark.parametrize("budget", [None, 700, 50])
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_gets_as_many_micro_batches_and_every_row_once(budget, world, packed):
    lengths = torch.tensor(lognormal_lengths(32, seed=world))
    rows = torch.arange(100, 132)  # row indices, not positions
    # Packed rows for dense attention, or one row of the budget per micro-batch (flash-attention's varlen).
    packed_min_width = {None: None, "dense": 0, "varlen": budget or 0}[packed]
    per_rank, oversized = rank_micro_slices(rows, lengths, world, balance=True, micro_batch_size=3, budget=budget,
                                            packed_min_width=packed_min_width)
    assert len({len(r) for r in per_rank}) == 1
    trained = sorted(int(i) for r in per_rank for mb in r for i in mb)
    assert trained == rows.tolist()
    length_of = dict(zip(rows.tolist(), lengths.tolist()))
    if budget is not None:
        for mbs in per_rank:  # within the budget, unless a row alone is longer
            for mb in mbs:
                sizes = [length_of[int(i)] for i in mb]
                if packed:  # whole packed rows of the width, laid out in the listed order
                    width = row_width(sizes, packed_min_width)
                    assert len(next_fit(sizes, width)) * width <= max(budget, width)
                else:
                    assert len(mb) * max(sizes) <= budget or len(mb) == 1
        assert oversized == int((lengths > budget).sum())
    # The shares are what rank_shares says (the metric is computed from them).
    shares = rank_shares(lengths, world, balance=True)
    for mbs, share in zip(per_rank, shares):
        assert sorted(int(i) for mb in mbs for i in mb) == sorted(rows[share].tolist())


class AllRanksInOne(Learner):
    """Every rank's micro-batches of the deepspeed plan, one after the other (their gradients add up)."""

    world, budget = 3, 20

    def _micro_slices(self, rows, attention_mask):
        assert len(rows) % self.world == 0  # deepspeed pads each mini-batch to a multiple of W
        per_rank, _ = rank_micro_slices(rows, attention_mask[rows].sum(-1), self.world, balance=True,
                                        micro_batch_size=self.algo.micro_batch_size, budget=self.budget,
                                        packed_min_width=self._packed_min_width())
        assert len(per_rank[0]) >= 2
        return [mb for mbs in per_rank for mb in mbs]


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_rank_plan_gives_the_unsplit_loss_and_gradient(tiny_model_dir, loss_agg):
    algo = AlgoConf(name="grpo", lr=1e-3, loss_agg=loss_agg, micro_batch_size=2, mini_batches=1, kl_coef=0.02)
    batch = make_batch(algo, seed=5, num_groups=3, k=4)  # 12 rows: 3 ranks x 4
    model = ModelConf(path=tiny_model_dir)
    whole = Learner(TorchBackendConf(), model, algo, total_steps=10, seed=0)
    split = AllRanksInOne(TorchBackendConf(), model, algo, total_steps=10, seed=0)
    got, want = split.train_step_blocking(batch), whole.train_step_blocking(batch)
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm",
                "train/response_tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-8), key
    for (name, p), q in zip(split.model.named_parameters(), whole.model.parameters()):
        assert float((p.grad - q.grad).norm()) <= 1e-6 * float(q.grad.norm()) + 1e-12, name
