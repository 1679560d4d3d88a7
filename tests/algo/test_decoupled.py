"""The decoupled PPO objective (algo.proximal) against hand-computed values (train steps: tests/backend)."""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.losses import (
    aggregate_loss,
    clipped_policy_loss,
    proximal_logprobs,
    tis_weights,
)
from rlharness.config.schema import AlgoConf, ConfigError


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


# One sequence, three tokens trained at step 5: versions 4 (on-policy), 3 and 1 (stale).
CURRENT = t([[-1.0, -2.0, -0.5]])
BEHAVIOUR = t([[-1.2, -1.0, -3.0]])
STEPS = torch.tensor([[4, 3, 1]])


def prox(method, updates_done=0, updates_per_step=1, start=None):
    return proximal_logprobs(method, current=CURRENT, behaviour=BEHAVIOUR, model_steps=STEPS, train_step=5,
                             updates_done=updates_done, updates_per_step=updates_per_step, start_of_step=start)


def test_recompute_is_the_start_of_step_policy():
    assert torch.equal(prox("recompute"), CURRENT)  # before any update: the current weights are the proximal ones
    start = t([[-0.9, -1.9, -0.4]])
    assert torch.equal(prox("recompute", updates_done=2, updates_per_step=4, start=start), start)
    with pytest.raises(ValueError, match="needs the start-of-step log-probs"):
        prox("recompute", updates_done=1, updates_per_step=2)


def test_behaviour_is_the_coupled_objective():
    assert torch.equal(prox("behaviour"), BEHAVIOUR)


def test_loglinear_interpolates_by_version_in_update_units():
    # Before any update alpha = 1 everywhere: exactly `recompute`.
    assert torch.allclose(prox("loglinear"), CURRENT)
    # 2 updates per step, 1 done. Versions behind the proximal (step 5 -> proximal version 4): 0, 1, 3
    # steps = 0, 2, 6 updates; alpha = behind / (behind + 1) = 0, 2/3, 6/7.
    got = prox("loglinear", updates_done=1, updates_per_step=2)
    want = t([[-1.2, -1.0 + 2 / 3 * (-2.0 + 1.0), -3.0 + 6 / 7 * (-0.5 + 3.0)]])
    assert torch.allclose(got, want)
    assert not got.requires_grad


def test_unknown_method_and_config_are_refused():
    with pytest.raises(ValueError, match="algo.proximal='clip' is not allowed"):
        prox("clip")
    with pytest.raises(ConfigError, match="algo.proximal='proximal' is not allowed"):
        AlgoConf(name="grpo", proximal="proximal")


def test_decoupled_loss_hand_values():
    """Clip against the proximal policy, weight by the truncated behaviour/proximal ratio.

    Proximal = [-1.0, -2.0, -0.5] (recompute, before the update); the trained policy moved to
    logprobs = proximal + [0.1, -0.3, 0.0]; A = [1, -1, 2]; clip 0.2; cap 2.
    ratio r = exp([0.1, -0.3, 0]) = [1.1052, 0.7408, 1]: token 2 (A < 0, r < 0.8) is clipped
    -> loss -A*0.8 = 0.8; token 1: -1.1052; token 3: -2.
    behaviour/proximal weight exp(prox - behaviour) = exp([0.2, -1.0, 2.5]) -> [1.2214, 0.3679, 2 (capped)].
    """
    proximal = prox("recompute")
    logprobs = (proximal + t([[0.1, -0.3, 0.0]])).requires_grad_(True)
    adv = t([[1.0, -1.0, 2.0]])
    mask = t([[1.0, 1.0, 1.0]])
    loss, clipped = clipped_policy_loss(logprobs, proximal, adv, 0.2, 0.2)
    weights, stats = tis_weights(proximal, BEHAVIOUR, mask, cap=2.0)
    assert torch.allclose(loss, t([[-math.exp(0.1), 0.8, -2.0]]), atol=1e-6)
    assert clipped.tolist() == [[False, True, False]]
    assert torch.allclose(weights, t([[math.exp(0.2), math.exp(-1.0), 2.0]]), atol=1e-6)
    assert stats["truncated_sum"].item() == 1.0
    total = aggregate_loss(loss * weights, mask, "token_mean")
    assert math.isclose(total.item(), (-math.exp(0.1) * math.exp(0.2) + 0.8 * math.exp(-1.0) - 4.0) / 3, rel_tol=1e-6)
    total.backward()
    # d/dlogprob of -A r w: token 1 -A r w = -exp(0.1) e^0.2; token 2 clipped: 0; token 3 -2 * 1 * 2.
    assert torch.allclose(logprobs.grad, t([[-math.exp(0.1) * math.exp(0.2), 0.0, -4.0]]) / 3, atol=1e-6)


def test_coupled_objective_clips_stale_tokens_against_the_behaviour_policy():
    """With proximal = behaviour, a token whose policy moved far since it was sampled sits outside the
    clip range from the first update (its gradient removed), whatever the current step's trust region."""
    logprobs = CURRENT.clone().requires_grad_(True)
    adv = t([[1.0, 1.0, 1.0]])
    coupled, clipped = clipped_policy_loss(logprobs, prox("behaviour"), adv, 0.2, 0.2)
    # r = exp(current - behaviour) = exp([0.2, -1.0, 2.5]): tokens 1 and 3 clipped (r > 1.2), token 2 not.
    assert clipped.tolist() == [[True, False, True]]
    decoupled, clipped_d = clipped_policy_loss(logprobs, prox("recompute"), adv, 0.2, 0.2)
    assert clipped_d.tolist() == [[False, False, False]]  # r = 1 against the proximal policy
