"""Rewards that cannot teach anything: every group with equal rewards for steps on end, or a reward
distribution that no longer moves from step to step."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from rlharness.config.schema import RewardFrozenConf, ZeroSignalConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import finite_or


class ZeroSignal:
    """`rollout/groups_zero_signal_frac` = 1 (every group's rewards equal: advantage 0 everywhere) for
    `steps` steps in a row; once per streak."""

    name = "zero_signal"

    def __init__(self, conf: ZeroSignalConf) -> None:
        self.conf = conf
        self.in_a_row = 0

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        frac = row.get("rollout/groups_zero_signal_frac")
        if frac is None:
            return {}, []
        self.in_a_row = self.in_a_row + 1 if frac >= 1.0 else 0
        alarm = None
        if self.in_a_row == self.conf.steps:
            alarm = Alarm(
                self.name, int(row["step"]), "no learning signal",
                f"every group of the last {self.conf.steps} steps had equal rewards "
                f"(rollout/groups_zero_signal_frac=1): nothing is being learned",
                "check the sampling (temperature, top_p, top_k), whether the task suits the model (all right or "
                "all wrong), and the judger")
        return {"health/zero_signal_steps": float(self.in_a_row)}, [alarm] if alarm else []


class RewardFrozen:
    """Over `window_steps` steps, the standard deviation of `rollout/reward_mean` from step to step is
    below `max_ratio` x the standard error that sampling alone gives a step's mean (reward_std /
    sqrt(samples)): the rewards no longer depend on what is sampled. Healthy runs sit near 1 or above."""

    name = "reward_frozen"

    def __init__(self, conf: RewardFrozenConf) -> None:
        self.conf = conf
        self.window: deque = deque(maxlen=conf.window_steps)
        self.latch = Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        m, sd, n = row.get("rollout/reward_mean"), row.get("rollout/reward_std"), row.get("rollout/num_samples")
        if m is None or sd is None or not n:
            return {}, []
        self.window.append((int(row["step"]), float(m), float(sd), float(n)))
        if len(self.window) < self.conf.window_steps:
            return {}, []
        means = np.array([w[1] for w in self.window])
        spread = float(means.std(ddof=1))
        se = float(np.mean([w[2] / math.sqrt(w[3]) for w in self.window]))
        ratio = spread / se if se > 0 else (0.0 if spread == 0 else math.inf)
        alarm = None
        if self.latch(ratio < self.conf.max_ratio):
            first, last = self.window[0][0], self.window[-1][0]
            alarm = Alarm(
                self.name, last, "the reward distribution stopped moving",
                f"rollout/reward_mean stayed within {means.min():.4f}-{means.max():.4f} over steps {first}-{last} "
                f"(step-to-step std {spread:.2e}, {ratio:.3f} x the {se:.2e} sampling alone gives; "
                f"health.reward_frozen.max_ratio={self.conf.max_ratio:g})",
                "check the judger (a pattern that matches everything, a constant or cached score, a reward model "
                "that ignores the response) and that the engine receives the trained weights")
        return {"health/reward_frozen_ratio": finite_or(ratio)}, [alarm] if alarm else []
