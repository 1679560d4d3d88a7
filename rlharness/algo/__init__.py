"""RL algorithms as pure tensor functions: advantage estimators, policy losses, corrections, shaping."""

from rlharness.algo.advantages import (
    compute_advantages,
    drgrpo_advantages,
    get_advantage_estimator,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlharness.algo.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    clipped_policy_loss,
    compute_policy_loss,
    get_policy_loss,
    kl_penalty,
    loss_denominator,
    masked_mean,
    rejection_mask,
    tis_weights,
    token_entropy,
    token_logprobs,
)
from rlharness.algo.shaping import overlong_penalty

__all__ = [
    "LOSS_AGG_MODES", "aggregate_loss", "clipped_policy_loss",
    "compute_advantages", "compute_policy_loss", "drgrpo_advantages", "get_advantage_estimator",
    "get_policy_loss", "grpo_advantages", "kl_penalty", "loss_denominator", "masked_mean", "overlong_penalty",
    "reinforce_pp_advantages", "rejection_mask", "rloo_advantages",
    "tis_weights", "token_entropy", "token_logprobs",
]
