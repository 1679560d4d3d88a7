"""The learning-rate plan, and how it changes when a run is extended.

A run's LR follows `lr_multiplier` over `total_steps`: linear warmup, then constant,
cosine or linear decay to `min_lr_ratio`. Resuming with another `total_steps`
(`resume=<dir> total_steps=800`) must not restart that decay (it would jump from the
decayed LR back to the peak). The rule: **the rest of the schedule is re-planned from
the LR the run has now**: from the checkpoint's step, the same schedule shape goes from
the current LR to `min_lr_ratio` at the new `total_steps` (a run still in warmup simply
finishes warmup and decays over the new length; extending a finished run continues at its
floor). The plan is saved with the optimizer, so resuming an extended run again
continues the same re-planned curve.

A resume also **applies this run's optimizer settings from the resumed step**: loading the
optimizer and scheduler state would otherwise bring back the first life's `algo.lr`,
`algo.weight_decay` and `algo.adam_beta1/2` (recorded in `.hydra/resumed-*/` yet ignored).
`apply_optimizer_settings` puts the configured values into the loaded state and says what
changed; the schedule's shape (`lr_schedule`, `warmup_steps`, `min_lr_ratio`) is read from the
config at every step, so a change of it applies from the resumed step too, and the LR the
resumed step trains with is logged when it differs from the one the checkpoint held.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class LRPlan:
    total_steps: int
    start_step: int = 0  # the decay runs from (start_step, start_multiplier) to (total_steps, min_lr_ratio)
    start_multiplier: float = 1.0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float,
                  start_step: int = 0, start_multiplier: float = 1.0) -> float:
    """LR factor for training step `step` (0-based): linear warmup, then constant/cosine/linear decay
    from `start_multiplier` at max(warmup_steps, start_step) to `min_lr_ratio` at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    begin = max(warmup_steps, start_step)
    top = start_multiplier if start_step > warmup_steps else 1.0
    progress = min(1.0, max(0, step - begin) / max(1, total_steps - begin))
    if schedule == "cosine":
        return min_lr_ratio + (top - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return top - (top - min_lr_ratio) * progress
    raise ValueError(f"algo.lr_schedule={schedule!r} is not allowed: expected constant, cosine or linear")


def planned(step: int, plan: LRPlan, algo) -> float:
    return lr_multiplier(step, warmup_steps=algo.warmup_steps, total_steps=plan.total_steps,
                         schedule=algo.lr_schedule, min_lr_ratio=algo.min_lr_ratio,
                         start_step=plan.start_step, start_multiplier=plan.start_multiplier)


def replan(saved: dict[str, Any] | None, step: int, total_steps: int, current_multiplier: float,
           algo) -> tuple[LRPlan, str | None]:
    """The plan to continue with after resuming at `step` (steps done) with `total_steps`, and a
    message when it changed. `saved` is None for checkpoints written before plans were saved:
    their old length is unknown, so the current LR decides whether the schedule moved."""
    old = LRPlan(**saved) if saved else None
    if old is not None and old.total_steps == total_steps:
        return old, None
    fresh = LRPlan(total_steps)
    if old is None and math.isclose(planned(step, fresh, algo), current_multiplier, rel_tol=1e-6, abs_tol=1e-12):
        return fresh, None
    if step <= algo.warmup_steps or algo.lr_schedule == "constant":
        new = fresh  # nothing has decayed yet: decay over the new length
    else:
        new = LRPlan(total_steps, start_step=step, start_multiplier=current_multiplier)
    end = planned(max(total_steps - 1, step), new, algo)
    was = f"was {old.total_steps}" if old else "was another length"
    return new, (f"LR schedule re-planned for total_steps={total_steps} ({was}): from step {step} the LR goes "
                 f"{algo.lr * current_multiplier:.3g} -> {algo.lr * end:.3g} ({algo.lr_schedule}) instead of "
                 f"restarting the schedule")


def apply_optimizer_settings(optimizer, scheduler, algo) -> list[str]:
    """Set `algo`'s lr (the scheduler's base), weight decay and betas on a loaded optimizer; returns
    `key: old -> new` for every setting the checkpoint held otherwise."""
    changes: list[str] = []
    wanted = {"weight_decay": algo.weight_decay, "betas": (algo.adam_beta1, algo.adam_beta2)}
    for group in optimizer.param_groups:
        for name, value in wanted.items():
            old = tuple(group[name]) if name == "betas" else group[name]
            if old != value:
                changes.append(f"algo.{name}: {old} -> {value}" if name != "betas" else
                               f"algo.adam_beta1/2: {old[0]}, {old[1]} -> {value[0]}, {value[1]}")
                group[name] = value
        if group.get("initial_lr", algo.lr) != algo.lr:
            changes.append(f"algo.lr: {group['initial_lr']:.3g} -> {algo.lr:.3g}")
        group["initial_lr"] = algo.lr
    if any(b != algo.lr for b in scheduler.base_lrs):
        scheduler.base_lrs = [algo.lr] * len(scheduler.base_lrs)
    return list(dict.fromkeys(changes))  # once, not once per parameter group
