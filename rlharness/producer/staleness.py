"""The run's staleness policy: one frozen object every part of the producer asks.

A sample trained at `train_step` whose oldest token came from weight version v has
staleness `train_step - v - 1`. A task's bound is its own
`tasks.<name>.max_staleness` or the run's `max_staleness`; with `sync_weights_interval`
= w the threshold is `(bound + 1) * w` (one sync period of lag is inherent, hence +1).

- `token` mode (default): the replay buffer expires a group once any sample reaches the
  threshold (`expired`); the producer only avoids producing what would expire on
  arrival (`may_produce_for`, and `caps_target` for a task tighter than the run).
- `admission` mode (`strategy.staleness_mode=admission`, AReaL's bound): a group may
  start only for a step within the threshold of the engines' weights (`admission_room`);
  nothing expires for staleness.
Every group that starts without tokens is stamped with its admission (`stamp`: the group's
`Admission`); the staleness at admission is `step - 1 - version` (`Admission.staleness`).

Built once per run (`rlharness/launch/build.py`, `staleness_policy`) and handed to the replay
buffer, the strategy, each task's ProduceContext and the manager; nothing else computes
a threshold.

`strategy.max_staleness` is kept as a second spelling of the top-level `max_staleness`,
at the config edge only (`adopt_strategy_max_staleness` in config/schema.py: given alone
it sets the run's bound, two different values are refused): existing configs and sweeps
keep working, and no runtime code reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Callable, Mapping

from rlharness.config.schema import STALENESS_MODES
from rlharness.core.types import Admission, Group, staleness

# The config key each field comes from (for messages that name what to change).
CONFIG_KEYS = {"max_staleness": "max_staleness", "sync_weights_interval": "sync_weights_interval",
               "mode": "strategy.staleness_mode", "task_bounds": "tasks.<name>.max_staleness"}


def stale_threshold(max_staleness: int, sync_weights_interval: int) -> int:
    """Staleness at which a sample expires: one sync period of lag is inherent, hence +1."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness} must be >= 0")
    if sync_weights_interval < 1:
        raise ValueError(f"sync_weights_interval={sync_weights_interval} must be >= 1")
    return (max_staleness + 1) * sync_weights_interval


@dataclass(frozen=True)
class StalenessPolicy:
    max_staleness: int  # the run's bound (the largest any task may use)
    sync_weights_interval: int = 1  # train steps between weight syncs
    mode: str = "token"  # token | admission
    task_bounds: Mapping[str, int] = field(default_factory=dict)  # tasks tighter than the run
    _thresholds: Mapping[str | None, int] = field(init=False, repr=False, compare=False)  # None: the run's

    def __post_init__(self) -> None:
        if self.mode not in STALENESS_MODES:
            raise ValueError(f"staleness_mode={self.mode!r} is not one of {', '.join(STALENESS_MODES)}")
        run = stale_threshold(self.max_staleness, self.sync_weights_interval)
        wider = {t: b for t, b in self.task_bounds.items() if not 0 <= b <= self.max_staleness}
        if wider:
            raise ValueError(f"task bounds {wider} must be within 0..max_staleness={self.max_staleness}")
        object.__setattr__(self, "task_bounds", MappingProxyType(dict(self.task_bounds)))
        thresholds = {t: stale_threshold(b, self.sync_weights_interval) for t, b in self.task_bounds.items()}
        object.__setattr__(self, "_thresholds", MappingProxyType({None: run, **thresholds}))

    # ------------------------------------------------------------------ bounds
    @property
    def admission(self) -> bool:
        """The bound is held where groups start (admission room), never by expiry."""
        return self.mode == "admission"

    @property
    def expires(self) -> bool:
        """The replay buffer expires too-stale groups (token mode)."""
        return self.mode == "token"

    def bound(self, task: str | None = None) -> int:
        """`task`'s max_staleness: its own or the run's (None: the run's)."""
        return self.task_bounds.get(task, self.max_staleness)

    def threshold(self, task: str | None = None) -> int:
        """Staleness at which `task`'s samples expire (or past which none is admitted)."""
        return self._thresholds.get(task, self._thresholds[None])

    def furthest_step(self, model_step: int, task: str | None = None) -> int:
        """The last train step a sample of weight version `model_step` may be trained at (or admitted for)."""
        return model_step + self.threshold(task)

    # ------------------------------------------------------------------ questions
    def expired(self, oldest_version: float, train_step: int, task: str) -> bool:
        """Whether a group of `task` whose oldest token has version `oldest_version` is past its bound."""
        return self.expires and staleness(oldest_version, train_step) >= self.threshold(task)

    def may_produce_for(self, train_step: int, model_step: int) -> bool:
        """Whether samples generated now on weight version `model_step` are within the run's bound at `train_step`."""
        return train_step <= self.furthest_step(model_step)

    def caps_target(self, task: str) -> bool:
        """Token mode, `task` tighter than the run: its producer caps its target at the steps its
        groups would not expire for (the run's bound lets the others produce further)."""
        return self.expires and self.threshold(task) < self.threshold()

    def admission_room(self, task: str, *, model_step: int, next_train_step: int, consumed: int, available: int,
                       step_size: Callable[[int], int]) -> int:
        """The most groups of `task` that may be in flight now so that every group produced (`consumed`,
        and `available` = consumed + waiting COMPLETED, plus those in flight) is budgeted for a step
        within the bound of version `model_step`: the steps from `next_train_step` up to
        `furthest_step`, from absolute counts (AReaL's max_head_offpolicyness)."""
        last = self.furthest_step(model_step, task)
        return consumed + sum(step_size(s) for s in range(next_train_step, last + 1)) - available

    def stamp(self, group: Group, *, version: int, step: int) -> None:
        """Stamp a group starting without tokens: its weight version, the step it is budgeted for,
        and its task's bound (the ledger shows the bound held)."""
        group.admission = Admission(version, step, self.bound(group.task))

    # ------------------------------------------------------------------ checkpoint and checks
    def state_dict(self) -> dict:
        """The keys a replay buffer checkpoint has always carried (for reading, never re-applied)."""
        return {"max_staleness": self.max_staleness, "sync_weights_interval": self.sync_weights_interval,
                "staleness_mode": self.mode, "task_max_staleness": dict(self.task_bounds)}

    def disagreements(self, other: StalenessPolicy, whose: str) -> list[str]:
        """One line per setting where this policy differs from `whose` (`other`), by config key."""
        def shown(value):
            return dict(value) if isinstance(value, Mapping) else value
        return [f"{CONFIG_KEYS[f.name]}={shown(getattr(self, f.name))!r} disagrees with {whose} "
                f"({shown(getattr(other, f.name))!r})"
                for f in fields(self) if f.compare and getattr(self, f.name) != getattr(other, f.name)]
