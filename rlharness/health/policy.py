"""The policy's own numbers going wrong: entropy that collapses, KL to the reference that accelerates."""

from __future__ import annotations

import math

import numpy as np

from rlharness.config.schema import EntropyCollapseConf, KLAccelerationConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import finite_or, mean


class EntropyCollapse:
    """`train/entropy` (per response token, at the sampling temperature): the mean of the last
    `window_steps` steps below `min_ratio` x the mean of the run's first `window_steps`, while the
    trained reward's mean over the same last steps is less than `min_reward_gain` standard deviations
    (of the first steps' sampled rewards) above its start: the policy narrows without getting better,
    and with nothing left to explore it stops learning. (A policy that narrows onto what scores, as
    `experiment=chat_tools` does from 0.16 to 0.03 nats per token, is converging.)"""

    name = "entropy_collapse"

    def __init__(self, conf: EntropyCollapseConf) -> None:
        self.conf = conf
        self.values: list[tuple[int, float]] = []
        self.rewards: list[tuple[float, float]] = []  # (rollout/reward_mean, rollout/reward_std) of those steps
        self.latch = Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        entropy = row.get("train/entropy")
        if entropy is None:
            return {}, []
        self.values.append((int(row["step"]), float(entropy)))
        self.rewards.append((float(row.get("rollout/reward_mean", 0.0)), float(row.get("rollout/reward_std", 0.0))))
        w = self.conf.window_steps
        if len(self.values) < 2 * w:
            return {}, []
        start = mean([v for _, v in self.values[:w]])
        now = mean([v for _, v in self.values[-w:]])
        if start <= 0:
            return {}, []
        ratio = now / start
        spread = mean([sd for _, sd in self.rewards[:w]])
        gain = mean([m for m, _ in self.rewards[-w:]]) - mean([m for m, _ in self.rewards[:w]])
        gain_sd = gain / spread if spread > 0 else (math.inf if gain > 0 else 0.0)
        alarm = None
        if self.latch(ratio < self.conf.min_ratio and gain_sd < self.conf.min_reward_gain):
            first, last = self.values[:w], self.values[-w:]
            alarm = Alarm(
                self.name, last[-1][0], "the policy's entropy collapsed without the reward rising",
                f"train/entropy {now:.4f} (mean of steps {last[0][0]}-{last[-1][0]}) is {ratio:.3f} x its start "
                f"{start:.4f} (steps {first[0][0]}-{first[-1][0]}), under health.entropy_collapse.min_ratio="
                f"{self.conf.min_ratio:g}, while rollout/reward_mean moved {gain:+.4f} ({gain_sd:+.2f} standard "
                f"deviations of the start's rewards, min_reward_gain={self.conf.min_reward_gain:g})",
                "lower algo.lr, add an entropy bonus (algo.entropy_coef) or a KL term (algo.kl_coef), raise "
                "algo.clip_eps_high (clip-higher), check the sampling temperature and that the reward depends on "
                "the response; roll back to a checkpoint from before the collapse")
        return {"health/entropy_ratio": ratio, "health/entropy_reward_gain_sd": finite_or(gain_sd)}, \
            [alarm] if alarm else []


class KLAcceleration:
    """`train/kl` (logged non-zero only with a KL term, algo.kl_coef > 0) growing faster and faster: over
    three windows of `window_steps` steps with means m1, m2, m3, the last growth m3 - m2 is `ratio` x the
    growth before it (m2 - m1, or any growth after a flat or falling KL) and `min_growth` x m2, sure (m3
    above m2 by `rise_t` standard errors of the difference), with m3 above `min_kl`. A healthy KL rises
    early and flattens, each growth smaller than the last, and wanders around its level by less than
    half of it (docs/operations/health.md)."""

    name = "kl_acceleration"

    def __init__(self, conf: KLAccelerationConf) -> None:
        self.conf = conf
        self.values: list[tuple[int, float]] = []
        self.latch = Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        kl = row.get("train/kl")
        if kl is None or (kl == 0 and not self.values):  # no KL term: nothing to watch
            return {}, []
        self.values.append((int(row["step"]), float(kl)))
        w = self.conf.window_steps
        if len(self.values) < 3 * w:
            return {}, []
        windows = [[v for _, v in self.values[-(3 - i) * w:len(self.values) - (2 - i) * w]] for i in range(3)]
        m1, m2, m3 = (float(np.mean(x)) for x in windows)
        growth, before = m3 - m2, m2 - m1
        accel = growth / before if before > 0 else (math.inf if growth > 0 else 0.0)
        se = math.sqrt(np.var(windows[1], ddof=1) / w + np.var(windows[2], ddof=1) / w)
        t = growth / se if se > 0 else (math.inf if growth > 0 else 0.0)
        c = self.conf
        alarm = None
        if self.latch(t >= c.rise_t and accel >= c.ratio and growth >= c.min_growth * m2 and m3 >= c.min_kl):
            steps = [s for s, _ in self.values[-3 * w:]]
            alarm = Alarm(
                self.name, steps[-1], "the KL to the reference policy is accelerating",
                f"train/kl means over steps {steps[0]}-{steps[w - 1]}, {steps[w]}-{steps[2 * w - 1]}, "
                f"{steps[2 * w]}-{steps[-1]}: {m1:.4f}, {m2:.4f}, {m3:.4f}: it grew {growth:+.4f} (t={t:.1f}) after "
                f"{before:+.4f}, {'x' + format(accel, '.1f') if math.isfinite(accel) else 'from flat'} (health."
                f"kl_acceleration.ratio={c.ratio:g}, min_growth={c.min_growth:g})",
                "lower algo.lr, raise algo.kl_coef, clamp it (algo.kl_clamp), or roll back to a checkpoint before "
                "the acceleration")
        return {"health/kl_accel": finite_or(accel)}, [alarm] if alarm else []
