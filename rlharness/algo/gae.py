"""PPO with a critic: token rewards, GAE, whitening, the clipped value loss (pure tensor functions).

Layout as everywhere in the trainer ([B, T], `rlharness/trainer/batch.py`): position t of row b
is a token of prompt + response; `mask[b, t] = 1` for the response tokens the policy produced and
trains on, 0 for prompt, padding and tokens the agent loop inserted (tool output). `values[b, t]`
is the critic's value of the state *before* token t (read from the hidden state at t - 1, the
same shift as the token's log-prob).

GAE follows verl's `compute_gae_advantage_return` (verl/trainer/ppo/core_algos.py, itself
TRL's): a backward scan in which masked positions are skipped, not terminal. Across a tool
output the next state of the last generated token is the first generated token after it
(discounted once by gamma), so a multi-turn episode is one trajectory whose observations carry
no value and no TD error. After the last generated token the value is 0 (the episode ends).
Unlike verl, positions outside the mask get advantage and return 0 (verl leaves the scan's
carry there; the loss masks them either way).
"""

from __future__ import annotations

import torch


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] rewards: each row's `scores[b]` on its last masked token, 0 elsewhere (0 everywhere for a
    row without masked tokens: there is no action to credit)."""
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must be [B] for a mask of shape {tuple(mask.shape)}, got {tuple(scores.shape)}")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = last >= 0
    rewards[has.nonzero(as_tuple=True)[0], last[has]] = scores[has].float()
    return rewards


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), [B, T] each, 0 outside `mask`; not whitened (`masked_whiten`).

    delta_t = r_t + gamma * V(next) - V_t and A_t = delta_t + gamma * lam * A(next), where "next" is
    the next masked position of the row (V = A = 0 past the last one); returns = A + V.
    """
    if not (rewards.shape == values.shape == mask.shape):
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape")
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    next_value = torch.zeros(mask.shape[0], device=mask.device)
    next_adv = torch.zeros(mask.shape[0], device=mask.device)
    advantages = torch.zeros_like(values)
    for t in reversed(range(mask.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        # A masked-out position passes the carry through untouched (verl's formulation).
        next_value = torch.where(m > 0, values[:, t], next_value)
        next_adv = torch.where(m > 0, adv, next_adv)
        advantages[:, t] = adv * m
    return advantages, (advantages + values) * mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries of the whole batch (unbiased variance, as
    verl's `masked_whiten`); 0 outside the mask. A batch of one masked token is only centred."""
    mask = mask.float()
    n = mask.sum()
    mean = masked_mean(x, mask)
    centred = (x - mean) * mask
    if n < 2:
        return centred
    var = (centred ** 2).sum() / (n - 1)
    return centred * torch.rsqrt(var + eps)


def clipped_value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       cliprange: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 0.5 * max((V - R)^2, (clip(V, V_old +- cliprange) - R)^2) and where the clipped term
    was the larger (verl's `compute_value_loss` before aggregation)."""
    clipped = old_values + (new_values - old_values).clamp(-cliprange, cliprange)
    plain_sq = (new_values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    return 0.5 * torch.maximum(plain_sq, clipped_sq), clipped_sq > plain_sq


MIN_RETURNS_VAR = 1e-12  # below it the returns are constant but for float32 rounding


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1: the critic predicts the
    returns; 0: no better than their mean; negative: worse). 0 when the returns do not vary: also
    when they vary only by float rounding (std <= 1e-6, e.g. a batch of zero rewards with gamma = lam
    = 1, whose returns are 0 but for rounding; the ratio would be -1e14)."""
    mask = mask.float()
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if float(var_r) <= MIN_RETURNS_VAR:
        return 0.0
    err = returns - values
    return float(1 - masked_mean((err - masked_mean(err, mask)) ** 2, mask) / var_r)
