"""Advantage estimators: rewards of a batch of groups [num_groups, k] -> per-sample advantages.

Pure tensor functions picked by name (as verl's `core_algos.py`): `algo.advantage` names one
in the table `ADVANTAGES` (rlharness/config/schema.py). Every estimator gives exactly 0 (never NaN, never a rounding residue) to a
group whose rewards are all equal: such groups stay in the batch and contribute
nothing to the gradient. (Without the explicit zero, the group mean's rounding error,
~1e-7, divided by std + eps would push every member the same way: 0.106 each for
twelve rewards of 0.7.) All four are group baselines, so a group of one sample gets 0
as well: training refuses `sampler.prompt_repeat_k=1` (RunConf), since nothing would learn.

- grpo: (r - group mean) / (group std + eps), std unbiased (as GRPO/verl); with
  `norm_adv_by_std=False` it is r - mean.
- drgrpo: r - group mean (Dr.GRPO drops the std division, which over-weights easy and
  hard prompts).
- rloo: r - mean of the *other* k - 1 rewards = k / (k - 1) * (r - group mean).
- reinforce_pp: verl's `reinforce_plus_plus_baseline` (REINFORCE++ with a group
  baseline, Hu et al. 2025): r - group mean, then whitened over the whole batch. verl
  whitens per token; here per sample, which differs only in how longer responses weigh
  in the batch statistics. Plain REINFORCE++ (`reinforce_plus_plus` in verl: discounted
  token returns with a per-token KL reward, whitened over the batch) is not offered: with
  outcome rewards and no KL in the reward it is the batch-whitened reward, one baseline
  for prompts of every difficulty, which the group baseline strictly improves on.

Each takes `mask` ([num_groups, k] bool, True = valid; None = all valid): a member left out
(an infrastructure failure, `algo.failed_member_policy=mask`) counts in no group statistic (mean,
std, the leave-one-out k, the batch whitening) and gets advantage 0; a group with fewer than two
valid members gets 0 throughout.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlharness.config.registry import resolve
from rlharness.config.schema import ADVANTAGES, AlgoConf

AdvantageFn = Callable[..., torch.Tensor]


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator `algo.advantage=name` names (the table: `ADVANTAGES` in rlharness/config/schema.py)."""
    if ADVANTAGES.get(name) is None:
        estimators = sorted(k for k, v in ADVANTAGES.items() if v is not None)
        raise ValueError(f"algo.advantage={name!r} is not a group estimator: expected one of {estimators}")
    return resolve(ADVANTAGES[name])


def _check_rewards(rewards: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards as float, the valid-member mask as bool, all True when none is given)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, k], got shape {tuple(rewards.shape)}")
    if mask is None:
        return rewards.float(), torch.ones(rewards.shape, dtype=torch.bool)
    if mask.shape != rewards.shape:
        raise ValueError(f"mask must have the rewards' shape {tuple(rewards.shape)}, got {tuple(mask.shape)}")
    return rewards.float(), mask.bool()


def _group_mean(r: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per group, the mean of its valid members' rewards ([G, 1]; 0 for a group without any)."""
    if bool(m.all()):  # torch's own reduction: a run without failed members trains the very same numbers
        return r.mean(dim=1, keepdim=True)
    n = m.sum(dim=1, keepdim=True)
    return torch.where(m, r, 0.0).sum(dim=1, keepdim=True) / n.clamp(min=1)


def _group_std(r: torch.Tensor, m: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Per group, the unbiased std of its valid members' rewards ([G, 1]; 0 with fewer than two)."""
    if bool(m.all()):  # as _group_mean
        return r.std(dim=1, keepdim=True) if r.shape[1] > 1 else torch.zeros_like(mean)
    n = m.sum(dim=1, keepdim=True)
    sq = torch.where(m, (r - mean) ** 2, 0.0).sum(dim=1, keepdim=True)
    return torch.where(n > 1, sq / (n - 1).clamp(min=1), 0.0).sqrt()


def _zero_all_equal(adv: torch.Tensor, r: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Exactly 0 for the left-out members, and for every member of a group whose valid rewards are
    all equal (or that has fewer than two valid members)."""
    hi = torch.where(m, r, -torch.inf).max(dim=1, keepdim=True).values
    lo = torch.where(m, r, torch.inf).min(dim=1, keepdim=True).values
    flat = (hi == lo) | (m.sum(dim=1, keepdim=True) < 2)
    return torch.where(flat | ~m, torch.zeros_like(adv), adv)


def grpo_advantages(rewards: torch.Tensor, *, mask: torch.Tensor | None = None, norm_adv_by_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    r, m = _check_rewards(rewards, mask)
    mean = _group_mean(r, m)
    adv = r - mean
    if norm_adv_by_std:
        adv = adv / (_group_std(r, m, mean) + eps)
    return _zero_all_equal(adv, r, m)


def drgrpo_advantages(rewards: torch.Tensor, *, mask: torch.Tensor | None = None, **_: object) -> torch.Tensor:
    r, m = _check_rewards(rewards, mask)
    return _zero_all_equal(r - _group_mean(r, m), r, m)


def rloo_advantages(rewards: torch.Tensor, *, mask: torch.Tensor | None = None, **_: object) -> torch.Tensor:
    r, m = _check_rewards(rewards, mask)
    k = r.shape[1]
    n = m.sum(dim=1, keepdim=True).float()
    # r - mean of the other n - 1 valid rewards = n / (n - 1) * (r - mean), per group's own n.
    scale = (k / (k - 1) if k > 1 else 1.0) if bool(m.all()) else n / (n - 1).clamp(min=1)
    return _zero_all_equal((r - _group_mean(r, m)) * scale, r, m)


def reinforce_pp_advantages(rewards: torch.Tensor, *, mask: torch.Tensor | None = None, eps: float = 1e-6,
                            **_: object) -> torch.Tensor:
    r, m = _check_rewards(rewards, mask)
    centred = _zero_all_equal(r - _group_mean(r, m), r, m)
    # Whitening over the valid members of the batch: their mean of `centred` is already 0 up to
    # rounding; subtract it anyway (as verl's masked_whiten), then zero the all-equal groups again.
    valid = centred[m]
    if valid.numel() == 0:
        return torch.zeros_like(r)
    std = valid.std() if valid.numel() > 1 else torch.zeros(())
    return _zero_all_equal((centred - valid.mean()) / (std + eps), r, m)


def compute_advantages(rewards: torch.Tensor, algo: AlgoConf, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The estimator named by `algo.advantage`; `algo.norm_adv_by_std` applies to grpo. `mask` ([G, k],
    True = valid): members left out of their group's statistics (and given advantage 0)."""
    fn = get_advantage_estimator(algo.advantage)
    return fn(rewards, mask=mask, norm_adv_by_std=algo.norm_adv_by_std)
