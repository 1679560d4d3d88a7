"""Runs that cannot learn: every group's rewards equal, so a group baseline gives advantage 0.

Every advantage estimator here (`algo.advantage`) subtracts its group's mean: a group whose
samples all get the same reward trains nothing. Greedy sampling makes every sample of a
group the same response, so every group has zero signal from the first step: said here, at the
start. A task too hard or too easy for the model does the same over time: the health monitor
`zero_signal` says that (rlharness/health/learning_signal.py).
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
