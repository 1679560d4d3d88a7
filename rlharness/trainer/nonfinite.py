"""Non-finite training steps: skipped, counted, and a stop when they keep coming.

A step is non-finite when its batch's advantages are (nothing is trained), or the
backend skipped an update because the loss or gradient was NaN/inf, or it reports a
non-finite loss or gradient norm. Such a step leaves the weights as they were; the
run goes on and counts it (`train/nonfinite_steps`). After
`trainer.max_nonfinite_steps` of them in a row the run stops with one line naming the
step and the likely cause. Weights that became non-finite (an applied update with a
finite but far too high LR) cannot be undone: the run stops at once, and nothing is
saved or sent to the engines from them (the last checkpoint stays the one to resume).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from rlharness.core.types import TrainBatch

log = logging.getLogger(__name__)

# Rewards this large are no score a judger means: with a baseline that is not divided by the
# group's std (Dr.GRPO), they reach the loss and its gradient as they are.
HUGE_REWARD = 1e6


class NonFiniteTraining(RuntimeError):
    """Training cannot go on: non-finite steps in a row, or non-finite weights. The message says which."""


def batch_problem(batch: TrainBatch) -> str | None:
    """Why `batch` cannot be trained (non-finite advantages), or None."""
    import torch  # not at the top: train.py imports this module for its exception (see rlharness/model/load.py)

    if not bool(torch.isfinite(batch.advantages).all()):
        return "the batch's advantages are non-finite"
    return None


def step_problem(train_metrics: dict[str, Any]) -> str | None:
    """What was non-finite in a trained step (from the backend's metrics), or None."""
    if train_metrics.get("train/skipped_updates", 0.0) > 0:
        return (f"{train_metrics['train/skipped_updates']:g} of {train_metrics.get('train/num_updates', 1):g} "
                f"optimizer update(s) skipped: non-finite gradient")
    for key in ("train/loss", "train/grad_norm"):
        value = train_metrics.get(key)
        if value is not None and not math.isfinite(value):
            return f"{key}={value}"
    return None


def likely_cause(batch_metrics: dict[str, Any], algo) -> str:
    """A guess, from what the step saw, at why its numbers overflowed."""
    low, high = batch_metrics.get("rollout/reward_min"), batch_metrics.get("rollout/reward_max")
    if low is not None and high is not None and max(abs(low), abs(high)) >= HUGE_REWARD:
        scaled = "" if algo.norm_adv_by_std else f" (algo.advantage={algo.advantage} does not divide by the std)"
        return (f"rewards from {low:g} to {high:g}{scaled}: the judger's scores overflow the loss; keep rewards "
                f"in a small range")
    return (f"algo.lr={algo.lr:g} may be too high (or algo.kl_coef={algo.kl_coef:g} / algo.entropy_coef="
            f"{algo.entropy_coef:g} too large): lower it and resume from the last checkpoint")


class NonFiniteGuard:
    """Counts non-finite steps; raises `NonFiniteTraining` when the run must stop."""

    def __init__(self, max_in_a_row: int, algo) -> None:
        self.max_in_a_row = max_in_a_row
        self.algo = algo
        self.in_a_row = 0
        self.total = 0
        self.weights_bad = False  # set once the weights are non-finite: nothing may be saved from them

    def record(self, step: int, problem: str | None, train_metrics: dict[str, Any],
               batch_metrics: dict[str, Any]) -> dict[str, float]:
        """Account for `step`; returns its metrics, or raises when the run must stop."""
        if train_metrics.get("train/weights_finite", 1.0) < 1.0:
            self.weights_bad = True
            raise NonFiniteTraining(
                f"step {step}: the weights are non-finite after the optimizer step; likely cause: "
                f"{likely_cause(batch_metrics, self.algo)} (no checkpoint is written from these weights)")
        if problem is None:
            self.in_a_row = 0
        else:
            self.in_a_row += 1
            self.total += 1
            log.warning("step %d skipped (%d in a row, trainer.max_nonfinite_steps=%d): %s", step, self.in_a_row,
                        self.max_in_a_row, problem)
            if self.in_a_row >= self.max_in_a_row:
                raise NonFiniteTraining(
                    f"step {step}: {self.in_a_row} non-finite steps in a row (trainer.max_nonfinite_steps="
                    f"{self.max_in_a_row}), the last: {problem}; likely cause: "
                    f"{likely_cause(batch_metrics, self.algo)}")
        return {"train/nonfinite_steps": float(self.total), "train/nonfinite_step": float(problem is not None)}
