"""Advantage estimators against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.advantages import (
    compute_advantages,
    drgrpo_advantages,
    get_advantage_estimator,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlharness.config.schema import ADVANTAGES, AlgoConf

EPS = 1e-6


def close(actual: torch.Tensor, expected: list[list[float]], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=tol, rtol=0)


ESTIMATORS = sorted(k for k, v in ADVANTAGES.items() if v is not None)


def test_every_configured_estimator_is_a_function_of_this_module():
    assert ESTIMATORS == ["drgrpo", "grpo", "reinforce_pp", "rloo"]
    assert get_advantage_estimator("grpo") is grpo_advantages
    for name in ("ppo", "gae"):  # not a name; gae is the backend's (it needs the critic)
        with pytest.raises(ValueError, match=f"algo.advantage='{name}'"):
            get_advantage_estimator(name)


def test_grpo_hand_values():
    # group 1: [1, 0, 0, 0]: mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    # group 2: [1, 1, 0, 0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    adv = grpo_advantages(torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 0, 0]]), eps=0.0)
    s = math.sqrt(1 / 3)
    close(adv, [[1.5, -0.5, -0.5, -0.5], [0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]])


def test_grpo_without_std_is_centred_reward():
    adv = grpo_advantages(torch.tensor([[3.0, 1.0]]), norm_adv_by_std=False)
    close(adv, [[1.0, -1.0]])


def test_drgrpo_hand_values():
    close(drgrpo_advantages(torch.tensor([[1.0, 0, 0, 0], [2.0, 4.0, 0, 2.0]])),
          [[0.75, -0.25, -0.25, -0.25], [0.0, 2.0, -2.0, 0.0]])


def test_rloo_hand_values():
    # r_i - mean of the other three: 1 - 0 = 1; 0 - 1/3
    close(rloo_advantages(torch.tensor([[1.0, 0, 0, 0]])), [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    # [3, 1]: 3 - 1 = 2, 1 - 3 = -2
    close(rloo_advantages(torch.tensor([[3.0, 1.0]])), [[2.0, -2.0]])


def test_reinforce_pp_hand_values():
    # centred: [[0.5, -0.5], [1, -1]], batch mean 0, unbiased std sqrt((0.25*2 + 1*2) / 3) = sqrt(5/6)
    adv = reinforce_pp_advantages(torch.tensor([[1.0, 0.0], [2.0, 0.0]]), eps=0.0)
    s = math.sqrt(5 / 6)
    close(adv, [[0.5 / s, -0.5 / s], [1 / s, -1 / s]])


@pytest.mark.parametrize("name", ESTIMATORS)
def test_group_of_one_gives_zero_not_nan(name):
    adv = get_advantage_estimator(name)(torch.tensor([[1.0], [0.0], [0.5]]))
    assert torch.isfinite(adv).all()
    close(adv, [[0.0], [0.0], [0.0]])


@pytest.mark.parametrize("name", ESTIMATORS)
def test_all_equal_rewards_give_zero(name):
    adv = get_advantage_estimator(name)(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.isfinite(adv).all()
    close(adv, [[0.0] * 3, [0.0] * 3])


def test_compute_advantages_dispatches_on_conf():
    r = torch.tensor([[1.0, 0, 0, 0]])
    close(compute_advantages(r, AlgoConf(name="x", advantage="grpo")), [[1.5, -0.5, -0.5, -0.5]], tol=1e-4)
    close(compute_advantages(r, AlgoConf(name="x", advantage="grpo", norm_adv_by_std=False)),
          [[0.75, -0.25, -0.25, -0.25]])
    close(compute_advantages(r, AlgoConf(name="x", advantage="rloo")), [[1.0, -1 / 3, -1 / 3, -1 / 3]])


def test_rejects_wrong_shape():
    with pytest.raises(ValueError, match="num_groups, k"):
        grpo_advantages(torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("value, k", [(0.7, 12), (0.1, 8), (1.1, 5), (0.0, 4)])
def test_all_equal_rewards_give_exactly_zero(name, value, k):
    # The group mean's rounding residue divided by std + eps used to push every member the
    # same way (+0.106 each for twelve rewards of 0.7 under grpo).
    fn = get_advantage_estimator(name)
    alone = fn(torch.full((1, k), value))
    assert (alone == 0).all(), alone
    # next to a group with signal (reinforce_pp whitens over the batch): still exactly 0
    mixed = fn(torch.cat([torch.full((1, k), value), torch.linspace(0, 1, k)[None]]))
    assert (mixed[0] == 0).all(), mixed
    assert mixed[1].abs().sum() > 0


# ----------------------------------------------------------------------------- left-out members (mask)
GROUP_LOCAL = {"grpo": grpo_advantages, "drgrpo": drgrpo_advantages, "rloo": rloo_advantages}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_an_all_valid_mask_changes_nothing(name):
    fn = get_advantage_estimator(name)
    r = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.2, 0.9, 0.9, 0.1], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(fn(r, mask=torch.ones_like(r, dtype=torch.bool)), fn(r), atol=0, rtol=0)


def _unmasked(name: str, r: torch.Tensor) -> torch.Tensor:
    """Each estimator as written with torch's own mean and std, before members could be left out."""
    k = r.shape[1]
    flat = r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values
    centred = torch.where(flat, 0.0, r - r.mean(dim=1, keepdim=True))
    if name == "grpo":
        return torch.where(flat, 0.0, centred / (r.std(dim=1, keepdim=True) + EPS))
    if name == "rloo":
        return centred * (k / (k - 1))
    if name == "reinforce_pp":
        return torch.where(flat, 0.0, (centred - centred.mean()) / (centred.std() + EPS))
    return centred


@pytest.mark.parametrize("name", ESTIMATORS)
def test_without_a_left_out_member_the_numbers_are_those_of_torchs_mean_and_std_to_the_bit(name):
    """A run without failed members trains the very numbers it trained before the mask existed (a masked
    std summed by hand differed from torch.std in the last bit, and so the default run's loss)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        r = torch.rand(8, 6, generator=g)
        r[::3] = (r[::3] > 0.5).float()
        assert torch.equal(get_advantage_estimator(name)(r), _unmasked(name, r))


@pytest.mark.parametrize("name", sorted(GROUP_LOCAL))
def test_a_left_out_member_counts_in_no_statistic_of_a_group_estimator(name):
    """A group [1, 0, <failed>, 0] gives its valid members exactly what the group [1, 0, 0] gives them (its
    mean, std and leave-one-out k are those of the three), whatever the failed member's placeholder reward;
    the failed member gets 0."""
    fn = GROUP_LOCAL[name]
    mask = torch.tensor([[True, True, False, True]])
    for placeholder in (0.0, 1.0, -7.0):
        adv = fn(torch.tensor([[1.0, 0.0, placeholder, 0.0]]), mask=mask)
        alone = fn(torch.tensor([[1.0, 0.0, 0.0]]))
        torch.testing.assert_close(adv[0, [0, 1, 3]], alone[0], atol=1e-6, rtol=0)
        assert adv[0, 2].item() == 0.0


def test_reinforce_pp_whitens_over_the_valid_members_of_the_batch_only():
    r = torch.tensor([[1.0, 0.0, 5.0], [0.5, 0.0, 1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = reinforce_pp_advantages(r, mask=mask, eps=0.0)
    centred = torch.tensor([1.0 - 0.5, 0.0 - 0.5, 0.5 - 0.5, 0.0 - 0.5, 1.0 - 0.5])  # the valid members
    expected = (centred - centred.mean()) / centred.std()
    torch.testing.assert_close(adv[mask], expected, atol=1e-6, rtol=0)
    assert adv[0, 2].item() == 0.0


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_group_with_fewer_than_two_valid_members_gets_zero(name):
    fn = get_advantage_estimator(name)
    r = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.5]])
    adv = fn(r, mask=torch.tensor([[True, False, False], [True, True, True]]))
    assert adv[0].tolist() == [0.0, 0.0, 0.0] and adv[1].abs().sum() > 0


def test_compute_advantages_passes_the_mask():
    r = torch.tensor([[1.0, 0.0, 9.0, 0.0]])
    mask = torch.tensor([[True, True, False, True]])
    torch.testing.assert_close(compute_advantages(r, AlgoConf(name="x", advantage="drgrpo"), mask=mask),
                               torch.tensor([[2 / 3, -1 / 3, 0.0, -1 / 3]]), atol=1e-6, rtol=0)
