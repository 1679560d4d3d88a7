"""Host memory that grows step after step, caught before it takes the machine down.

Each step logs `health/rss_mb` (resident memory of this process and its child processes: judging
workers, the W&B service) and `health/available_mb` (what the machine still has, psutil's `available`).
After `warmup_steps` (start-up and allocator warm-up grow memory in the first steps of every run), the
least-squares slope over the last `window_steps` is the growth per step; it alarms when it is sure
(`rise_t` standard errors above 0) and either above `max_mb_per_step` or large enough to use up the
available memory before `total_steps`.
"""

from __future__ import annotations

from collections import deque

import psutil

from rlharness.config.schema import HostMemoryConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import finite_or, slope_t

MB = 1024 * 1024


def host_memory_mb() -> dict[str, float]:
    """`health/rss_mb` of this process and its children, and the machine's `health/available_mb`."""
    me = psutil.Process()
    rss = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            rss += child.memory_info().rss
        except psutil.Error:  # it ended meanwhile
            pass
    return {"health/rss_mb": rss / MB, "health/available_mb": psutil.virtual_memory().available / MB}


class HostMemory:
    name = "host_memory"

    def __init__(self, conf: HostMemoryConf, total_steps: int) -> None:
        self.conf = conf
        self.total_steps = total_steps
        self.window: deque = deque(maxlen=conf.window_steps)
        self.latch = Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        step, rss = int(row["step"]), row.get("health/rss_mb")
        if rss is None or step <= self.conf.warmup_steps:
            return {}, []
        self.window.append((step, float(rss)))
        if len(self.window) < self.conf.window_steps:
            return {}, []
        steps, values = [s for s, _ in self.window], [v for _, v in self.window]
        slope, t = slope_t(values, steps)
        available = float(row.get("health/available_mb") or 0.0)
        left = self.total_steps - step
        c = self.conf
        alarm = None
        if self.latch(slope > 0 and t >= c.rise_t and (slope >= c.max_mb_per_step or slope * left >= available)):
            alarm = Alarm(
                self.name, step, "host memory grows step after step",
                f"health/rss_mb {values[0]:.0f} -> {values[-1]:.0f} MB over steps {steps[0]}-{steps[-1]} "
                f"({slope:+.1f} MB/step, t={t:.1f}); {available:.0f} MB available: at this rate "
                + (f"it is used up in {available / slope:.0f} steps, before the run's end ({left} steps left)"
                   if slope * left >= available else f"{slope * left:.0f} MB more by the run's end")
                + f" (health.host_memory.max_mb_per_step={c.max_mb_per_step:g})",
                "find what keeps growing (objects kept per step: lists of samples, tensors with their graph, a "
                "cache without a bound); save now (the last checkpoint is the one to resume) and restart from it")
        return {"health/rss_mb_per_step": finite_or(slope)}, [alarm] if alarm else []
