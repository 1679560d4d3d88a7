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


def _check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, k], got shape {tuple(rewards.shape)}")
    return rewards.float()


def _zero_all_equal(adv: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Exactly 0 for every member of a group whose rewards are all equal (or that has one member)."""
    flat = r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values
    return torch.where(flat, torch.zeros_like(adv), adv)


def _std(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std that is 0 (not NaN) when there is a single element."""
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2:
        return torch.zeros(()) if dim is None else torch.zeros_like(x.select(dim, 0))
    return x.std() if dim is None else x.std(dim=dim)


def grpo_advantages(rewards: torch.Tensor, *, norm_adv_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    r = _check_rewards(rewards)
    adv = r - r.mean(dim=1, keepdim=True)
    if norm_adv_by_std:
        adv = adv / (_std(r, dim=1).unsqueeze(1) + eps)
    return _zero_all_equal(adv, r)


def drgrpo_advantages(rewards: torch.Tensor, **_: object) -> torch.Tensor:
    r = _check_rewards(rewards)
    return _zero_all_equal(r - r.mean(dim=1, keepdim=True), r)


def rloo_advantages(rewards: torch.Tensor, **_: object) -> torch.Tensor:
    r = _check_rewards(rewards)
    k = r.shape[1]
    if k < 2:
        return torch.zeros_like(r)
    return _zero_all_equal((r - r.mean(dim=1, keepdim=True)) * (k / (k - 1)), r)


def reinforce_pp_advantages(rewards: torch.Tensor, *, eps: float = 1e-6, **_: object) -> torch.Tensor:
    r = _check_rewards(rewards)
    centred = _zero_all_equal(r - r.mean(dim=1, keepdim=True), r)
    # Whitening: the batch mean of `centred` is already 0 up to rounding; subtract it anyway
    # (as verl's masked_whiten), then zero the all-equal groups again (the shift moved them).
    return _zero_all_equal((centred - centred.mean()) / (_std(centred) + eps), r)


def compute_advantages(rewards: torch.Tensor, algo: AlgoConf) -> torch.Tensor:
    """The estimator named by `algo.advantage`; `algo.norm_adv_by_std` applies to grpo."""
    fn = get_advantage_estimator(algo.advantage)
    return fn(rewards, norm_adv_by_std=algo.norm_adv_by_std)
