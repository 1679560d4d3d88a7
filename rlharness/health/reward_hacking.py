"""Reward hacking: the trained reward rises while a score the policy is not trained on falls.

Two independent scores are watched:

- `eval/accuracy` (greedy, held-out prompts) when the trained reward is not what eval scores with (a
  learned reward model or an LLM judge; eval always uses the task's rule judger). At each eval the
  accuracy is compared with the best earlier one, in standard errors of the difference of two
  proportions over `eval.num_prompts` prompts; the trained reward (`rollout/reward_mean`) over the
  steps since that best eval must be rising, its least-squares slope `rise_t` standard errors above 0
  (the learned reward of `experiment=arith_rm` swings from 0.4 to 2.3 between steps: t=3.1 at its fall).
- The parts of a router judger (`rollout/reward_<part>_mean`, logged per step; a part may weigh 0 and
  only be watched, as `experiment=arith_rm` watches the math judger): over the last `window_steps`
  steps one part rises (slope `part_t` standard errors above 0) while another falls as surely, by at
  least `min_drop` over the window.
"""

from __future__ import annotations

import math
import re
from collections import deque

from rlharness.config.schema import RewardHackingConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import finite_or, slope_t

PART = re.compile(r"^rollout/reward_([^/]+)_mean$")
ADVICE = ("stop or roll back to the checkpoint before the fall, then give the verifiable reward more weight "
          "(judger.weights), add a KL term (algo.kl_coef), lower algo.lr, or retrain the reward model on the "
          "policy's own mistakes")


def proportion_drop_z(before: float, now: float, n: int) -> float:
    """How many standard errors `now` lies below `before`, both shares of `n` independent trials."""
    se = math.sqrt((before * (1 - before) + now * (1 - now)) / n)
    drop = before - now
    if se == 0:
        return math.inf if drop > 0 else 0.0
    return drop / se


class RewardHacking:
    name = "reward_hacking"

    def __init__(self, conf: RewardHackingConf, eval_independent: bool, eval_prompts: int) -> None:
        self.conf = conf
        self.eval_independent = eval_independent
        self.eval_prompts = eval_prompts
        self.rewards: list[tuple[int, float]] = []  # (step, rollout/reward_mean)
        self.evals: list[tuple[int, float]] = []  # (step, eval/accuracy)
        self.parts: dict[str, deque] = {}
        self.eval_latch, self.parts_latch = Latch(), Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        step = int(row["step"])
        if row.get("rollout/reward_mean") is not None:
            self.rewards.append((step, float(row["rollout/reward_mean"])))
        metrics: dict[str, float] = {}
        eval_alarm = self._eval_check(step, row, metrics)
        parts_alarm = self._parts_check(step, row, metrics)
        return metrics, [a for a in (eval_alarm, parts_alarm) if a is not None]

    def _eval_check(self, step: int, row: dict, metrics: dict) -> Alarm | None:
        acc = row.get("eval/accuracy")
        if not self.eval_independent or acc is None:
            return None
        alarm = None
        if self.evals:
            best_step, best = max(self.evals, key=lambda e: e[1])  # the first of equal bests
            z = proportion_drop_z(best, acc, self.eval_prompts)
            since = [(s, r) for s, r in self.rewards if s > best_step]
            slope, t = slope_t([r for _, r in since], [s for s, _ in since])
            metrics["health/eval_drop_z"] = finite_or(z)
            metrics["health/reward_rise_t"] = finite_or(t)
            c = self.conf
            if self.eval_latch(z >= c.drop_z and best - acc >= c.min_drop and t >= c.rise_t):
                alarm = Alarm(
                    self.name, step, "the trained reward rises while eval/accuracy (independent of it) falls",
                    f"eval/accuracy {best:.3f} at step {best_step} -> {acc:.3f} now ({z:.1f} standard errors over "
                    f"{self.eval_prompts} prompts), while rollout/reward_mean rose {since[0][1]:.3f} -> "
                    f"{since[-1][1]:.3f} over steps {since[0][0]}-{since[-1][0]} (slope {slope:+.4f}/step, t={t:.1f})",
                    ADVICE)
        self.evals.append((step, float(acc)))
        return alarm

    def _parts_check(self, step: int, row: dict, metrics: dict) -> Alarm | None:
        w = self.conf.window_steps
        for key, value in row.items():
            m = PART.match(key)
            if m and value is not None:
                self.parts.setdefault(m.group(1), deque(maxlen=w)).append((step, float(value)))
        full = {p: v for p, v in self.parts.items() if len(v) == w}
        if len(full) < 2:
            return None
        trends = {p: slope_t([x for _, x in v], [s for s, _ in v]) for p, v in full.items()}
        up = max(trends, key=lambda p: trends[p][1])
        down = min(trends, key=lambda p: trends[p][1])
        metrics["health/part_rise_t"] = finite_or(trends[up][1])
        metrics["health/part_fall_t"] = finite_or(trends[down][1])
        steps = [s for s, _ in full[down]]
        fall = -trends[down][0] * (steps[-1] - steps[0])
        c = self.conf
        if self.parts_latch(trends[up][1] >= c.part_t and trends[down][1] <= -c.part_t and fall >= c.min_drop):
            first, last = full[down][0][1], full[down][-1][1]
            return Alarm(
                self.name, step, f"judger part {up!r} rises while part {down!r} falls",
                f"rollout/reward_{up}_mean slope {trends[up][0]:+.4f}/step (t={trends[up][1]:.1f}), "
                f"rollout/reward_{down}_mean {first:.3f} -> {last:.3f} (slope {trends[down][0]:+.4f}/step, "
                f"t={trends[down][1]:.1f}) over steps {steps[0]}-{steps[-1]}", ADVICE)
        return None
