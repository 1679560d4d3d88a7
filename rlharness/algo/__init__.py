"""RL algorithms as pure tensor functions: advantage estimators and policy-loss pieces."""

from rlharness.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    drgrpo_advantages,
    get_advantage_estimator,
    grpo_advantages,
    register_advantage,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlharness.algo.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    clipped_policy_loss,
    kl_penalty,
    loss_denominator,
    masked_mean,
    tis_weights,
    token_entropy,
    token_logprobs,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "LOSS_AGG_MODES", "aggregate_loss", "clipped_policy_loss", "compute_advantages",
    "drgrpo_advantages", "get_advantage_estimator", "grpo_advantages", "kl_penalty", "loss_denominator",
    "masked_mean", "register_advantage", "reinforce_pp_advantages", "rloo_advantages", "tis_weights",
    "token_entropy", "token_logprobs",
]
