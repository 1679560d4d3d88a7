"""GAE, token rewards, whitening and the clipped value loss (rlharness/algo/gae.py).

Hand-computed cases (terminal states, tool-output gaps, lam=1 = Monte-Carlo returns - values),
and verl's own functions on random cases to 1e-6. verl is not a test dependency (importing
`verl.trainer.ppo.core_algos` pulls in ray, tensordict, hydra and more), so the reference
functions below are faithful transcriptions of verl at commit
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29):
`compute_gae_advantage_return` and `compute_value_loss` from verl/trainer/ppo/core_algos.py,
`masked_mean`, `masked_var`, `masked_whiten` from verl/utils/torch_functional.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.gae import (clipped_value_loss, explained_variance, gae_advantages, last_token_rewards,
                                masked_whiten)


# ----------------------------------------------------------------------------- verl, transcribed
def verl_masked_mean(values, mask, axis=None):
    s = (values * mask).sum(axis) if axis is not None else (values * mask).sum()
    return s / (mask.sum(axis=axis) + 1e-8) if axis is not None else s / (mask.sum() + 1e-8)


def verl_masked_var(values, mask, unbiased=True):
    mean = verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def verl_masked_whiten(values, mask, shift_mean=True):
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def verl_compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]

        for t in reversed(range(gen_len)):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam

            # skip values and TD-error on observation tokens
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam

            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)

        returns = advantages + values
        advantages = verl_masked_whiten(advantages, response_mask)
    return advantages, returns


def verl_compute_value_loss(vpreds, returns, values, response_mask, cliprange_value):
    vpredclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * verl_masked_mean(clipped_vf_losses, response_mask)  # agg_loss token-mean
    vf_clipfrac = verl_masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


# ----------------------------------------------------------------------------- hand-computed
def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_hand_computed_single_trajectory_with_prompt_and_padding():
    # prompt (mask 0), three response tokens, padding: reward 1 on the last response token.
    mask = t([[0, 1, 1, 1, 0]])
    values = t([[0, 0.5, 0.4, 0.8, 0]])
    rewards = last_token_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 1, 0]]
    gamma, lam = 0.9, 0.5
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    d3 = 1 - 0.8  # terminal: no value after the last token
    d2 = 0 + gamma * 0.8 - 0.4
    d1 = 0 + gamma * 0.4 - 0.5
    a3 = d3
    a2 = d2 + gamma * lam * a3
    a1 = d1 + gamma * lam * a2
    assert adv[0].tolist() == pytest.approx([0, a1, a2, a3, 0], abs=1e-7)
    assert ret[0].tolist() == pytest.approx([0, a1 + 0.5, a2 + 0.4, a3 + 0.8, 0], abs=1e-7)


def test_terminal_state_rows_do_not_leak_into_each_other_or_past_their_end():
    # Two rows of different lengths: row 0 ends at t=1 (its padding must not see row 1's values).
    mask = t([[1, 1, 0, 0], [1, 1, 1, 1]])
    values = t([[0.2, 0.3, 0, 0], [0.1, 0.1, 0.1, 0.1]])
    rewards = last_token_rewards(torch.tensor([2.0, -1.0]), mask)
    adv, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([2 - 0.2, 2 - 0.3, 0, 0], abs=1e-7)
    assert adv[1].tolist() == pytest.approx([-1.1, -1.1, -1.1, -1.1], abs=1e-7)
    # A row with nothing to train (every token masked: mask_truncated, say) gets no reward at all.
    assert last_token_rewards(torch.tensor([1.0]), t([[0, 0, 0]])).tolist() == [[0, 0, 0]]


def test_tool_output_gap_is_skipped_not_terminal():
    # model tokens at 1, 2; tool output at 3, 4 (mask 0); model tokens at 5, 6; reward on 6.
    mask = t([[0, 1, 1, 0, 0, 1, 1]])
    values = t([[0, 0.1, 0.2, 9.0, 9.0, 0.5, 0.6]])  # values inside the gap must play no part
    rewards = last_token_rewards(torch.tensor([1.0]), mask)
    assert rewards[0, 6] == 1 and rewards.sum() == 1
    gamma, lam = 0.8, 0.7
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    a6 = 1 - 0.6
    a5 = gamma * 0.6 - 0.5 + gamma * lam * a6
    a2 = gamma * 0.5 - 0.2 + gamma * lam * a5  # next state of token 2 is token 5, discounted once
    a1 = gamma * 0.2 - 0.1 + gamma * lam * a2
    assert adv[0].tolist() == pytest.approx([0, a1, a2, 0, 0, a5, a6], abs=1e-6)
    assert ret[0, 3] == 0 and ret[0, 4] == 0
    # The same trajectory without the gap gives the same advantages on the model's tokens.
    squeezed, _ = gae_advantages(rewards[:, [0, 1, 2, 5, 6]], values[:, [0, 1, 2, 5, 6]], mask[:, [0, 1, 2, 5, 6]],
                                 gamma, lam)
    assert squeezed[0].tolist() == pytest.approx(adv[0, [0, 1, 2, 5, 6]].tolist(), abs=1e-7)


def test_lam_one_equals_monte_carlo_returns_minus_values():
    gen = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 12, generator=gen) > 0.3).float()
    mask[:, :2] = 0  # prompts
    values = torch.randn(6, 12, generator=gen) * mask
    rewards = torch.randn(6, 12, generator=gen) * mask  # dense rewards (as with the KL reward)
    gamma = 0.95
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam=1.0)
    for b in range(6):
        idx = mask[b].nonzero().flatten().tolist()
        for j, pos in enumerate(idx):
            mc = sum(gamma ** i * float(rewards[b, p]) for i, p in enumerate(idx[j:]))
            assert float(adv[b, pos]) == pytest.approx(mc - float(values[b, pos]), abs=1e-5)
            assert float(ret[b, pos]) == pytest.approx(mc, abs=1e-5)


def test_lam_zero_is_the_one_step_td_error():
    mask = t([[1, 1, 1]])
    values = t([[0.3, 0.6, 0.9]])
    rewards = t([[0.0, 0.0, 1.0]])
    adv, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.0)
    assert adv[0].tolist() == pytest.approx([0.6 - 0.3, 0.9 - 0.6, 1 - 0.9], abs=1e-7)


# ----------------------------------------------------------------------------- against verl
@pytest.mark.parametrize("seed", range(20))
def test_gae_and_whitening_match_verl_on_random_cases(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, width = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(3, 40, (1,), generator=gen))
    mask = (torch.rand(rows, width, generator=gen) > 0.25).float()
    mask[:, 0] = 0
    mask[0, 1] = 1
    mask[0, -1] = 1  # at least two masked tokens (verl's unbiased variance needs them)
    gamma = float(torch.rand((), generator=gen)) if seed % 3 else 1.0
    lam = float(torch.rand((), generator=gen)) if seed % 4 else 1.0
    values = torch.randn(rows, width, generator=gen) * mask  # as verl's critic: values * response_mask
    scores = torch.randn(rows, generator=gen)
    rewards = last_token_rewards(scores, mask)
    if seed % 2:  # dense rewards too (KL in the reward)
        rewards = rewards - 0.1 * torch.randn(rows, width, generator=gen) * mask
    ref_adv, ref_ret = verl_compute_gae_advantage_return(rewards, values, mask, torch.tensor(gamma),
                                                         torch.tensor(lam))
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    m = mask > 0
    torch.testing.assert_close(masked_whiten(adv, mask)[m], ref_adv[m], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ret[m], ref_ret[m], atol=1e-6, rtol=1e-6)
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()


@pytest.mark.parametrize("seed", range(5))
def test_value_loss_matches_verl(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    mask = (torch.rand(4, 10, generator=gen) > 0.3).float()
    old, ret = torch.randn(4, 10, generator=gen), torch.randn(4, 10, generator=gen)
    new = old + torch.randn(4, 10, generator=gen)  # some move more than the clip range
    ref_loss, ref_clipfrac = verl_compute_value_loss(new, ret, old, mask, 0.5)
    tok, clipped = clipped_value_loss(new, old, ret, 0.5)
    assert float((tok * mask).sum() / mask.sum()) == pytest.approx(float(ref_loss), abs=1e-6)
    assert float((clipped.float() * mask).sum() / mask.sum()) == pytest.approx(float(ref_clipfrac), abs=1e-6)
    assert 0 < float(ref_clipfrac) < 1  # both branches are exercised


def test_clipped_value_loss_stops_rewarding_moves_past_the_clip():
    old, ret = t([0.0]), t([2.0])
    tok, clipped = clipped_value_loss(t([1.5]), old, ret, cliprange=0.5)
    # clip(1.5) = 0.5: the clipped error (1.5^2) is larger and is the loss.
    assert tok.item() == pytest.approx(0.5 * 1.5 ** 2) and clipped.item()
    tok, clipped = clipped_value_loss(t([0.3]), old, ret, cliprange=0.5)
    assert tok.item() == pytest.approx(0.5 * 1.7 ** 2) and not clipped.item()


def test_explained_variance():
    mask = t([[1, 1, 1, 0]])
    ret = t([[1.0, 2.0, 3.0, 100.0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.0), ret, mask) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(-ret, ret, mask) < 0
    assert explained_variance(ret, torch.ones_like(ret), mask) == 0.0  # constant returns: nothing to explain
    # Returns constant but for float32 rounding (zero rewards, gamma = lam = 1): 0, not about -1e14.
    values = t([[0.04, -0.02, 0.03, 0.0]])
    rounded = t([[0.0, 1e-9, -2e-9, 0.0]])
    assert explained_variance(values, rounded, mask) == 0.0


def test_whitening_is_over_the_masked_tokens_only():
    x = t([[5.0, 1.0, 2.0, 3.0]])
    mask = t([[0, 1, 1, 1]])
    w = masked_whiten(x, mask)
    assert w[0, 0] == 0
    assert w[0, 1:].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)  # unbiased std of 1, 2, 3 is 1
    assert not math.isnan(float(masked_whiten(t([[1.0]]), t([[1.0]])).sum()))
