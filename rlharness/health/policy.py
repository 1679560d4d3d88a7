"""The policy's own numbers going wrong: entropy that collapses, KL to the reference that accelerates."""

from __future__ import annotations

from rlharness.config.schema import EntropyCollapseConf, KLAccelerationConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import finite_or, mean, slope_t


class EntropyCollapse:
    """`train/entropy` (per response token, at the sampling temperature): the mean of the last
    `window_steps` steps below `min_ratio` x the mean of the run's first `window_steps`."""

    name = "entropy_collapse"

    def __init__(self, conf: EntropyCollapseConf) -> None:
        self.conf = conf
        self.values: list[tuple[int, float]] = []
        self.latch = Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        entropy = row.get("train/entropy")
        if entropy is None:
            return {}, []
        self.values.append((int(row["step"]), float(entropy)))
        w = self.conf.window_steps
        if len(self.values) < 2 * w:
            return {}, []
        start = mean([v for _, v in self.values[:w]])
        now = mean([v for _, v in self.values[-w:]])
        if start <= 0:
            return {}, []
        ratio = now / start
        alarm = None
        if self.latch(ratio < self.conf.min_ratio):
            first, last = self.values[:w], self.values[-w:]
            alarm = Alarm(
                self.name, last[-1][0], "the policy's entropy collapsed",
                f"train/entropy {now:.4f} (mean of steps {last[0][0]}-{last[-1][0]}) is {ratio:.3f} x its start "
                f"{start:.4f} (steps {first[0][0]}-{first[-1][0]}), under health.entropy_collapse.min_ratio="
                f"{self.conf.min_ratio:g}",
                "lower algo.lr, add an entropy bonus (algo.entropy_coef) or a KL term (algo.kl_coef), raise "
                "algo.clip_eps_high (clip-higher), check the sampling temperature; roll back to a checkpoint "
                "from before the collapse")
        return {"health/entropy_ratio": ratio}, [alarm] if alarm else []


class KLAcceleration:
    """`train/kl` (only logged non-zero with a KL term, algo.kl_coef > 0): its least-squares slope over
    the last `window_steps` steps is `ratio` x the slope over the `window_steps` before, sure
    (`rise_t` standard errors above 0), with the KL above `min_kl`. A healthy KL rises early and flattens."""

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
        if len(self.values) < 2 * w:
            return {}, []
        before, last = self.values[-2 * w:-w], self.values[-w:]
        s_before, _ = slope_t([v for _, v in before], [s for s, _ in before])
        s_last, t_last = slope_t([v for _, v in last], [s for s, _ in last])
        accel = s_last / abs(s_before) if s_before else (0.0 if s_last <= 0 else float("inf"))
        now = mean([v for _, v in last])
        c = self.conf
        alarm = None
        if self.latch(s_last > 0 and t_last >= c.rise_t and accel >= c.ratio and now >= c.min_kl):
            alarm = Alarm(
                self.name, last[-1][0], "the KL to the reference policy is accelerating",
                f"train/kl slope {s_last:+.5f}/step over steps {last[0][0]}-{last[-1][0]} (t={t_last:.1f}, mean "
                f"{now:.4f}) against {s_before:+.5f}/step over steps {before[0][0]}-{before[-1][0]}: "
                f"{accel:.1f}x, above health.kl_acceleration.ratio={c.ratio:g}",
                "lower algo.lr, raise algo.kl_coef, clamp it (algo.kl_clamp), or roll back to a checkpoint before "
                "the acceleration")
        return {"health/kl_accel": finite_or(accel)}, [alarm] if alarm else []
