"""Runs that cannot learn: every group's rewards equal, so a group baseline gives advantage 0.

Every advantage estimator here (`algo.advantage`) subtracts its group's mean: a group whose
samples all get the same reward trains nothing. Greedy sampling makes every sample of a
group the same response, so every group has zero signal from the first step; a task too
hard or too easy for the model does the same over time. Both are said, once each.
"""

from __future__ import annotations

import logging

from rlharness.config.schema import SamplingConf

log = logging.getLogger(__name__)

# A nucleus this small holds only the most likely token whenever that token has at least this
# probability, i.e. nearly always: sampling is then greedy in effect.
NEAR_GREEDY_TOP_P = 0.01


def greedy_reason(sampling: SamplingConf, key: str = "agent.sampling") -> str | None:
    """Which sampling setting makes every sample of a group the same response, or None."""
    if sampling.temperature == 0:
        return f"{key}.temperature=0 (greedy)"
    if sampling.top_k == 1:
        return f"{key}.top_k=1 (only the most likely token)"
    if sampling.top_p <= NEAR_GREEDY_TOP_P:
        return f"{key}.top_p={sampling.top_p:g} (the nucleus is almost always the most likely token alone)"
    return None


def warn_if_greedy(samplings: dict[str, SamplingConf], advantage: str) -> str | None:
    """The start-of-run warning for greedy rollout sampling (logged; returned for tests)."""
    for key, sampling in samplings.items():
        reason = greedy_reason(sampling, key)
        if reason is not None:
            message = (f"{reason} with algo.advantage={advantage} (a group baseline): every sample of a group "
                       f"is the same response, so every group will have zero signal and nothing is learned; "
                       f"sample with temperature > 0, top_p well above 0 and top_k 0 or > 1")
            log.warning(message)
            return message
    return None


class ZeroSignalWatch:
    """Warns once when `rollout/groups_zero_signal_frac` has been 1 for `steps` steps in a row
    (again after a step with signal and another such streak); steps = 0 never warns."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.in_a_row = 0

    def update(self, step: int, zero_signal_frac: float | None) -> str | None:
        if zero_signal_frac is None or zero_signal_frac < 1.0:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        if self.steps == 0 or self.in_a_row != self.steps:
            return None
        message = (f"step {step}: every group of the last {self.steps} steps had equal rewards "
                   f"(rollout/groups_zero_signal_frac=1): nothing is being learned; check the sampling (temperature, "
                   f"top_p, top_k), whether the task suits the model (all right or all wrong), and the judger")
        log.warning(message)
        return message
