"""RL algorithms as pure tensor functions: advantage estimators, policy losses, corrections, shaping."""

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
    POLICY_LOSSES,
    aggregate_loss,
    clipped_policy_loss,
    compute_policy_loss,
    get_policy_loss,
    kl_penalty,
    loss_denominator,
    masked_mean,
    register_policy_loss,
    rejection_mask,
    tis_weights,
    token_entropy,
    token_logprobs,
)
from rlharness.algo.shaping import overlong_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS", "LOSS_AGG_MODES", "POLICY_LOSSES", "aggregate_loss", "clipped_policy_loss",
    "compute_advantages", "compute_policy_loss", "drgrpo_advantages", "get_advantage_estimator",
    "get_policy_loss", "grpo_advantages", "kl_penalty", "loss_denominator", "masked_mean", "overlong_penalty",
    "register_advantage", "register_policy_loss", "reinforce_pp_advantages", "rejection_mask", "rloo_advantages",
    "tis_weights", "token_entropy", "token_logprobs",
]
