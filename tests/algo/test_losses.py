"""Loss pieces against hand-computed values: log-probs, clipping, aggregation, KL, entropy, TIS."""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.losses import (
    aggregate_loss,
    clipped_policy_loss,
    kl_penalty,
    loss_denominator,
    tis_weights,
    token_entropy,
    token_logprobs,
)


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_token_logprobs_uses_previous_position_logits():
    # vocab 2; logits at t predict token t+1.
    logits = t([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]]])  # [1, 3, 2]
    ids = torch.tensor([[1, 1, 0]])
    lp = token_logprobs(logits, ids)
    # pos 0: nothing predicts it -> 0; pos 1: uniform -> log 0.5; pos 2: p(0) = 3/4
    torch.testing.assert_close(lp, t([[0.0, math.log(0.5), math.log(0.75)]]))


def test_token_logprobs_temperature_scales_logits():
    logits = t([[[math.log(3.0), 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 0]])
    # at temperature 2: softmax([log3/2, 0]) -> p0 = sqrt(3) / (sqrt(3) + 1)
    expected = math.log(math.sqrt(3) / (math.sqrt(3) + 1))
    torch.testing.assert_close(token_logprobs(logits, ids, temperature=2.0), t([[0.0, expected]]))


def test_token_logprobs_matches_log_softmax_gather():
    torch.manual_seed(0)
    logits, ids = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, ids)[:, 1:], ref)


def test_entropy_hand_values_and_alignment():
    logits = t([[[0.0, 0.0], [100.0, 0.0], [0.0, 0.0]]])
    # uniform over 2 -> log 2 (predicts pos 1); near one-hot -> ~0 (predicts pos 2); last unused
    torch.testing.assert_close(token_entropy(logits), t([[0.0, math.log(2.0), 0.0]]), atol=1e-6, rtol=0)


def test_clipped_policy_loss_hand_values():
    old = t([[0.0, 0.0, 0.0, 0.0]])
    logp = t([[math.log(1.5), math.log(1.5), math.log(0.5), math.log(1.1)]])
    adv = t([[1.0, -1.0, -1.0, 2.0]])
    loss, clipped = clipped_policy_loss(logp, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    # r=1.5, A=1: max(-1.5, -1.28) = -1.28 (clipped).  r=1.5, A=-1: max(1.5, 1.28) = 1.5.
    # r=0.5, A=-1: max(0.5, 0.8) = 0.8 (clipped).       r=1.1, A=2: max(-2.2, -2.2) = -2.2.
    torch.testing.assert_close(loss, t([[-1.28, 1.5, 0.8, -2.2]]))
    assert clipped.tolist() == [[True, False, True, False]]


def test_clipped_loss_gradient_is_zero_when_clipped():
    logp = t([[math.log(1.5), math.log(1.1)]]).requires_grad_()
    loss, _ = clipped_policy_loss(logp, t([[0.0, 0.0]]), t([[1.0, 1.0]]), 0.2, 0.2)
    loss.sum().backward()
    # d(-A r)/d logp = -A r: 0 on the clipped token, -1.1 on the other
    torch.testing.assert_close(logp.grad, t([[0.0, -1.1]]))


PER_TOKEN = t([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = t([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregate_token_mean():
    # (1 + 2 + 3 + 4) / 4 tokens
    assert aggregate_loss(PER_TOKEN, MASK, "token_mean").item() == pytest.approx(2.5)


def test_aggregate_seq_mean_token_mean():
    # mean(2, 4)
    assert aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_mean").item() == pytest.approx(3.0)


def test_aggregate_seq_mean_token_sum_norm():
    # (6 / 8 + 4 / 8) / 2
    assert aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm", max_response_len=8).item() == pytest.approx(0.625)
    with pytest.raises(ValueError, match="max_response_len"):
        aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm")


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregate_in_parts_sums_to_whole(mode):
    den = loss_denominator(MASK, mode)
    whole = aggregate_loss(PER_TOKEN, MASK, mode, max_response_len=8)
    parts = sum(aggregate_loss(PER_TOKEN[i:i + 1], MASK[i:i + 1], mode, max_response_len=8, denominator=den)
                for i in range(2))
    assert parts.item() == pytest.approx(whole.item())


def test_aggregate_ignores_sequences_without_tokens():
    per_token = t([[2.0, 2.0], [9.0, 9.0]])
    mask = t([[1, 1], [0, 0]])
    assert aggregate_loss(per_token, mask, "seq_mean_token_mean").item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="algo.loss_agg='sum'"):
        aggregate_loss(per_token, mask, "sum")


def test_kl_k1_k3_hand_values():
    logp, ref = t([[math.log(0.5), math.log(0.2)]]), t([[math.log(0.25), math.log(0.2)]])
    # k1 = log(0.5/0.25) = log 2; k3 = q/p - log(q/p) - 1 = 0.5 + log 2 - 1
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), t([[math.log(2.0), 0.0]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), t([[0.5 + math.log(2.0) - 1.0, 0.0]]))
    with pytest.raises(ValueError, match="k2"):
        kl_penalty(logp, ref, "k2")


def test_kl_k3_is_nonnegative():
    torch.manual_seed(0)
    a, b = torch.randn(100), torch.randn(100)
    assert (kl_penalty(a, b, "k3") >= 0).all()


def test_tis_weights_hand_values():
    old = t([[0.0, math.log(0.5), math.log(0.9), 5.0]])
    rollout = t([[0.0, math.log(0.25), math.log(0.1), 0.0]])
    mask = t([[0, 1, 1, 0]])  # the last position is padding: its huge ratio must not count
    w, stats = tis_weights(old, rollout, mask, cap=2.0)
    # ratios on the mask: 0.5/0.25 = 2 (not truncated), 0.9/0.1 = 9 -> 2 (truncated)
    torch.testing.assert_close(w, t([[1.0, 2.0, 2.0, 1.0]]))
    assert not w.requires_grad
    assert stats["tokens"].item() == 2
    assert stats["ratio_sum"].item() == pytest.approx(11.0, rel=1e-5)
    assert stats["truncated_sum"].item() == 1
    assert stats["abs_diff_sum"].item() == pytest.approx(math.log(2.0) + math.log(9.0), rel=1e-5)


def test_tis_cap_zero_disables_weighting_but_measures():
    old, rollout, mask = t([[math.log(0.9)]]), t([[math.log(0.1)]]), t([[1]])
    w, stats = tis_weights(old, rollout, mask, cap=0.0)
    torch.testing.assert_close(w, t([[1.0]]))
    assert stats["truncated_sum"].item() == 0
    assert stats["ratio_sum"].item() == pytest.approx(9.0, rel=1e-5)
