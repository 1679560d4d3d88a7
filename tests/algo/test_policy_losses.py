"""Policy losses (ppo, dual_clip, gspo, cispo), off-policy corrections and robustness, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.losses import (
    aggregate_loss,
    clipped_policy_loss,
    get_policy_loss,
    kl_penalty,
    rejection_mask,
    tis_weights,
)
from rlharness.config.schema import POLICY_LOSSES

KW = dict(clip_eps_low=0.2, clip_eps_high=0.2, clip_ratio_c=3.0)


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_every_configured_loss_is_a_function_of_the_losses_module():
    from rlharness.algo import losses

    assert [get_policy_loss(n) for n in POLICY_LOSSES] == [losses.ppo_loss, losses.dual_clip_loss, losses.gspo_loss,
                                                           losses.cispo_loss]
    with pytest.raises(ValueError, match="algo.policy_loss='grpo'"):
        get_policy_loss("grpo")


def test_dual_clip_hand_values_and_zero_gradient_past_the_cap():
    # ratios 4, 2, 4, 0.5 against the old policy; advantages -1, -1, +1, -1
    logp = t([[math.log(4.0), math.log(2.0), math.log(4.0), math.log(0.5)]]).requires_grad_()
    old, adv, mask = t([[0.0] * 4]), t([[-1.0, -1.0, 1.0, -1.0]]), t([[1.0] * 4])
    ppo, ppo_clipped = get_policy_loss("ppo")(logp, old, adv, mask, **KW)
    # ppo: max(4, 1.2) = 4; max(2, 1.2) = 2; max(-4, -1.2) = -1.2 (clipped); max(0.5, 0.8) = 0.8 (clipped)
    torch.testing.assert_close(ppo, t([[4.0, 2.0, -1.2, 0.8]]))
    assert ppo_clipped.tolist() == [[False, False, True, True]]
    loss, clipped = get_policy_loss("dual_clip")(logp, old, adv, mask, **KW)
    # dual clip, A < 0: min(ppo, -c A = 3): 4 -> 3 (capped), 2, 0.8 stay; A > 0 untouched
    torch.testing.assert_close(loss, t([[3.0, 2.0, -1.2, 0.8]]))
    assert clipped.tolist() == [[True, False, True, True]]
    loss.sum().backward()
    # d(-A r)/d logp = -A r = 2 on the uncapped token; 0 where capped or clipped
    torch.testing.assert_close(logp.grad, t([[0.0, 2.0, 0.0, 0.0]]))


def test_gspo_hand_values_use_the_sequence_ratio():
    # seq 0: log-ratios [log 2, 0] -> s = exp(log 2 / 2) = sqrt 2, A = +1: clip -> -1.2 on each token
    # seq 1: log-ratios [log 1.1, log 1.1], then padding whose old log-prob is absurd (masked out)
    logp = t([[math.log(2.0), 0.0, 0.0], [math.log(1.1), math.log(1.1), 0.0]])
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, 100.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    adv = t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    loss, clipped = get_policy_loss("gspo")(logp, old, adv, mask, **KW)
    # seq 1: s = 1.1, A = -1: max(1.1, 1.1) = 1.1
    torch.testing.assert_close(loss[:, :2], t([[-1.2, -1.2], [1.1, 1.1]]))
    assert clipped[:, :2].tolist() == [[True, True], [False, False]]
    assert torch.isfinite(aggregate_loss(loss, mask, "seq_mean_token_mean"))


def test_gspo_gradient_is_the_sequence_objectives():
    torch.manual_seed(0)
    logp = (torch.randn(2, 4) * 0.05 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(2, 4) * 0.01  # ratios near 1: nothing clipped
    mask = t([[1, 1, 1, 0], [1, 1, 1, 1]])
    adv = t([[0.7] * 4, [-1.3] * 4])
    loss, clipped = get_policy_loss("gspo")(logp, old, adv, mask, **KW)
    assert not clipped[mask > 0].any()
    aggregate_loss(loss, mask, "seq_mean_token_mean").backward()
    ours = logp.grad.clone()
    # GSPO by its definition: mean over sequences of -A_i * exp(mean_t(logp - old))
    logp2 = logp.detach().clone().requires_grad_()
    s = torch.exp(((logp2 - old) * mask).sum(-1) / mask.sum(-1))
    (-(adv[:, 0] * s)).mean().backward()
    torch.testing.assert_close(ours, logp2.grad)


def test_cispo_hand_values_keep_the_gradient_of_clipped_tokens():
    logp = t([[math.log(1.5), math.log(0.9)]]).requires_grad_()
    old, adv, mask = t([[0.0, 0.0]]), t([[1.0, -1.0]]), t([[1.0, 1.0]])
    loss, clipped = get_policy_loss("cispo")(logp, old, adv, mask, **KW)
    # -sg[clip(r)] A logp: r = 1.5 -> 1.2: -1.2 * log 1.5; r = 0.9: -0.9 * -1 * log 0.9
    torch.testing.assert_close(loss, t([[-1.2 * math.log(1.5), 0.9 * math.log(0.9)]]))
    assert clipped.tolist() == [[True, False]]
    loss.sum().backward()
    # gradient -sg[w] A: the clipped token keeps its gradient (PPO would give it 0)
    torch.testing.assert_close(logp.grad, t([[-1.2, 0.9]]))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_is_plain_policy_gradient_on_policy(name):
    """At ratio 1 (one update per batch) every loss has the gradient -A grad(logp) / aggregation."""
    torch.manual_seed(1)
    logp = (torch.randn(3, 5) - 2.0).requires_grad_()
    mask = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    adv = torch.randn(3, 1).expand(3, 5).contiguous()
    loss, clipped = get_policy_loss(name)(logp, logp.detach(), adv, mask, **KW)
    assert not clipped.any()
    aggregate_loss(loss, mask, "seq_mean_token_mean").backward()
    expected = -adv * mask / mask.sum(-1, keepdim=True) / 3
    torch.testing.assert_close(logp.grad, expected)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_huge_log_ratio_gives_a_finite_loss_and_gradient(name):
    # A log-ratio of 100 (exp is inf in float32) on a response token, and a NaN-making
    # padding position: the loss and its gradient stay finite (the log-ratio is clamped at 20).
    logp = t([[100.0, -1.0, 0.0]]).requires_grad_()
    old = t([[0.0, -1.0, -200.0]])
    adv, mask = t([[-1.0, -1.0, -1.0]]), t([[1.0, 1.0, 0.0]])
    loss, _ = get_policy_loss(name)(logp, old, adv, mask, **KW)
    total = aggregate_loss(loss, mask, "seq_mean_token_mean")
    assert torch.isfinite(total)
    total.backward()
    assert torch.isfinite(logp.grad).all()


def test_ppo_log_ratio_clamped_at_20():
    loss, _ = clipped_policy_loss(t([[100.0]]), t([[0.0]]), t([[-1.0]]), 0.2, 0.2)
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_masking_keeps_an_infinity_out():
    per_token = t([[1.0, float("inf"), float("nan")]])
    mask = t([[1.0, 0.0, 0.0]])
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert aggregate_loss(per_token, mask, mode, max_response_len=4).item() == pytest.approx(
            1.0 if mode != "seq_mean_token_sum_norm" else 0.25)


def test_k3_clamp():
    logp, ref = t([[0.0, 0.0]]), t([[15.0, math.log(2.0)]])
    raw = kl_penalty(logp, ref, "k3")
    # k3 = exp(ref - logp) - (ref - logp) - 1
    torch.testing.assert_close(raw, t([[math.exp(15.0) - 16.0, 2.0 - math.log(2.0) - 1.0]]))
    capped = kl_penalty(logp, ref, "k3", clamp=10.0)
    torch.testing.assert_close(capped, t([[10.0, 2.0 - math.log(2.0) - 1.0]]))
    assert torch.isfinite(kl_penalty(t([[0.0]]), t([[500.0]]), "k3")).all()


# ----------------------------------------------------------------------------- corrections
OLD = t([[math.log(0.5), math.log(0.5), 0.0], [math.log(0.3), 0.0, 0.0]])
ROLLOUT = t([[math.log(0.25), math.log(0.25), 0.0], [math.log(0.2), 0.0, 7.0]])
MASK = t([[1, 1, 0], [1, 0, 0]])  # token ratios: [2, 2 | pad], [1.5 | pad, pad]


def test_token_tis_hand_values():
    w, stats = tis_weights(OLD, ROLLOUT, MASK, cap=1.8, level="token")
    torch.testing.assert_close(w, t([[1.8, 1.8, 1.0], [1.5, 1.0, 1.0]]))
    assert stats["truncated_sum"].item() == 2 and stats["tokens"].item() == 3
    assert stats["ratio_sum"].item() == pytest.approx(5.5, rel=1e-5)


def test_sequence_tis_hand_values():
    # sequence ratios: 2 * 2 = 4 on both tokens of seq 0; 1.5 on seq 1
    w, stats = tis_weights(OLD, ROLLOUT, MASK, cap=3.0, level="sequence")
    torch.testing.assert_close(w, t([[3.0, 3.0, 1.0], [1.5, 1.0, 1.0]]))
    assert not w.requires_grad
    assert stats["truncated_sum"].item() == 2  # both tokens of the truncated sequence
    assert stats["ratio_sum"].item() == pytest.approx(4 + 4 + 1.5, rel=1e-5)
    assert stats["abs_diff_sum"].item() == pytest.approx(2 * math.log(2.0) + math.log(1.5), rel=1e-5)


def test_token_rejection_hand_values():
    # token ratios 2, 2, 1.5 against [0.5, 1.8]: the two 2s are rejected
    keep, stats = rejection_mask(OLD, ROLLOUT, MASK, low=0.5, high=1.8, level="token")
    torch.testing.assert_close(keep, t([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))
    assert stats["rejected_sum"].item() == 2
    # the lower bound: [1.6, 3] rejects 1.5
    keep, _ = rejection_mask(OLD, ROLLOUT, MASK, low=1.6, high=3.0, level="token")
    torch.testing.assert_close(keep, t([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))


def test_sequence_rejection_hand_values():
    # sequence ratios 4 and 1.5 against [0.5, 3]: all of seq 0 is rejected, even though each token's 2 is inside
    keep, stats = rejection_mask(OLD, ROLLOUT, MASK, low=0.5, high=3.0, level="sequence")
    torch.testing.assert_close(keep, t([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))
    assert stats["rejected_sum"].item() == 2
