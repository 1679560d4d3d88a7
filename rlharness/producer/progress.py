"""ProduceProgress: producer/consumer progress as absolute cumulative counts.

Targets and consumption are totals since the start of the run (per task), so a
group the consumer already took is never mistaken for a shortfall and produced
again (the seed's design). The manager owns one object and updates it in place;
strategies read it live through the produce context, never copy it across awaits.

- next_consumer_step: the step the next `get_batch`/`produce_batch` trains.
- producer_future_step: the step the producer is currently producing for.
- target_samples[task]: groups that must have been produced (consumed + waiting
  COMPLETED) once the producer reaches `target_upto_future_step`.
- consumed_samples[task]: groups the consumer has taken.
- last_step: the run's final training step (0 = unbounded). Set by the manager, not
  checkpointed (a resumed run passes it again): nothing is produced for later steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable


def _exact(weight: float) -> Fraction:
    """A weight as the decimal the user wrote (0.7 is 7/10, not the nearest binary float)."""
    return Fraction(repr(float(weight)))


def allocate_batch_sizes(batch_size: int, weights: dict[str, float], carry: dict[str, Fraction] | None = None
                         ) -> tuple[dict[str, int], dict[str, Fraction]]:
    """One step's split of `batch_size` groups over tasks by weight: largest remainder.

    Each task's quota is its exact share plus the remainder it carried from the steps
    before; it gets the quota's floor, and the groups left over go to the largest
    fractional parts (ties: the task listed first). Returns (sizes, carry for the next
    step). Carries stay within (-1, 1), so after t steps a task has trained its exact
    share t * batch_size * weight to within one group (the seeds' allocate_batch_sizes,
    made exact over the run). Exact rational arithmetic: the same split on any machine.
    """
    if batch_size < len(weights):
        raise ValueError(f"batch_size={batch_size} is smaller than the number of tasks ({len(weights)}: "
                         f"{list(weights)})")
    bad = {t: w for t, w in weights.items() if not w > 0}
    if bad:
        raise ValueError(f"task weights must be > 0, got {bad}")
    total = sum(_exact(w) for w in weights.values())
    quota = {t: batch_size * _exact(w) / total + (carry or {}).get(t, Fraction(0)) for t, w in weights.items()}
    sizes = {t: max(0, math.floor(q)) for t, q in quota.items()}
    left = batch_size - sum(sizes.values())
    by_remainder = sorted(weights, key=lambda t: quota[t] - sizes[t], reverse=True)  # stable: listing order
    for t in by_remainder[:left]:
        sizes[t] += 1
    return sizes, {t: quota[t] - sizes[t] for t in weights}


class BatchAllocation:
    """Per-step group counts per task, a pure function of (batch size, weights, step).

    Steps are computed in order and cached, so any step (a resumed run's, the async
    producer's future steps) gets the same split. A task that left the mix
    (`leave(task, step)`) gets nothing from that step on; the others share its weight.
    A run resumed with other weights (`load_state_dict(..., from_step=)`) keeps the
    split of the steps before and uses the new weights from the resumed step on
    (`history`), the remainders carried across the change.
    """

    def __init__(self, batch_size: int, weights: dict[str, float]) -> None:
        allocate_batch_sizes(batch_size, weights)  # refuse bad input now
        self.batch_size = batch_size
        self.weights = dict(weights)  # the weights in effect now (the last of `history`)
        self.history: list[tuple[int, dict[str, float]]] = [(1, dict(weights))]  # (first step, weights)
        self.left: dict[str, int] = {}  # task -> first step without it
        self._sizes: list[dict[str, int]] = []  # step s -> self._sizes[s - 1]
        self._cum: list[dict[str, int]] = []  # step s -> groups over steps 1..s
        self._carry: dict[str, Fraction] = {}

    @property
    def tasks(self) -> list[str]:
        return list(self.weights)

    def sizes(self, step: int) -> dict[str, int]:
        if step < 1:
            raise ValueError(f"steps start at 1, got {step}")
        while len(self._sizes) < step:
            s = len(self._sizes) + 1
            weights = next(w for first, w in reversed(self.history) if first <= s)
            active = {t: w for t, w in weights.items() if self.left.get(t, s + 1) > s}
            sizes, self._carry = allocate_batch_sizes(self.batch_size, active, self._carry)
            self._sizes.append({t: sizes.get(t, 0) for t in self.weights})
        return dict(self._sizes[step - 1])

    def cumulative(self, step: int) -> dict[str, int]:
        """Groups per task over steps 1..step (prefix sums, cached with the sizes)."""
        if step < 1:
            return {t: 0 for t in self.weights}
        self.sizes(step)
        while len(self._cum) < step:
            before = self._cum[-1] if self._cum else {t: 0 for t in self.weights}
            now = self._sizes[len(self._cum)]
            self._cum.append({t: before[t] + now[t] for t in self.weights})
        return dict(self._cum[step - 1])

    def share(self, task: str) -> int:
        """`task`'s groups per step on average, rounded up (its per-step scale, e.g. for over-sampling)."""
        total = sum(_exact(w) for w in self.weights.values())
        return max(1, math.ceil(self.batch_size * _exact(self.weights[task]) / total))

    def leave(self, task: str, step: int) -> None:
        """`task` takes no groups from `step` on (its data ran out); the others share its weight."""
        if task in self.left:
            return
        if len(self.weights) - len(self.left) <= 1:
            raise ValueError(f"task {task!r} cannot leave the mix: it is the last task")
        self.left[task] = step
        self._rebuild()

    def _rebuild(self) -> None:
        """Forget the cache; steps are recomputed from step 1 (the same up to any leave)."""
        self._sizes, self._cum, self._carry = [], [], {}

    def state_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "weights": dict(self.weights), "left": dict(self.left),
                "history": [[first, dict(w)] for first, w in self.history]}

    def load_state_dict(self, state: dict[str, Any], from_step: int | None = None) -> bool:
        """Restore a saved allocation. With `from_step` (a resumed run's next step), this object's
        weights, if they differ from the checkpoint's, apply from that step on; without it the saved
        weights are adopted. Returns whether the weights changed. Another batch size or another set
        of tasks is refused."""
        if state["batch_size"] != self.batch_size or set(state["weights"]) != set(self.weights):
            raise ValueError(
                f"the checkpoint's task mix is batch_size={state['batch_size']}, weights={state['weights']}; "
                f"this run has batch_size={self.batch_size}, weights={self.weights}: resume with the same "
                f"batch_size and tasks (weights may change)")
        history = [(int(first), dict(w)) for first, w in state.get("history", [(1, state["weights"])])]
        changed = from_step is not None and history[-1][1] != self.weights
        if changed:
            history = [(first, w) for first, w in history if first < from_step] + [(from_step, dict(self.weights))]
        self.history = history
        self.weights = dict(history[-1][1])
        self.left = dict(state["left"])
        self._rebuild()
        return changed


@dataclass
class ProduceProgress:
    next_consumer_step: int = 1
    producer_future_step: int = 1
    target_upto_future_step: int = 0
    consumed_samples: dict[str, int] = field(default_factory=dict)
    target_samples: dict[str, int] = field(default_factory=dict)
    last_step: int = 0

    @classmethod
    def build(cls, tasks: list[str]) -> "ProduceProgress":
        return cls(consumed_samples={t: 0 for t in tasks}, target_samples={t: 0 for t in tasks})

    def ensure_target_upto(self, future_step: int, allocation: "BatchAllocation") -> None:
        """Advance the cumulative targets to cover every step up to `future_step`."""
        while self.target_upto_future_step < future_step:
            self.target_upto_future_step += 1
            for task, n in allocation.sizes(self.target_upto_future_step).items():
                self.target_samples[task] += n

    def follow_split(self, from_step: int, old_sizes: Callable[[int], dict[str, int]],
                     new_sizes: Callable[[int], dict[str, int]]) -> None:
        """The split of the steps from `from_step` on changed (a task left the mix, or a resumed run's
        new weights): the targets already set for them (up to `target_upto_future_step`) follow."""
        for step in range(from_step, self.target_upto_future_step + 1):
            old, new = old_sizes(step), new_sizes(step)
            for task in new:
                self.target_samples[task] += new[task] - old[task]

    def at_last_step(self) -> bool:
        """The targets already cover the run's last step (so over-sampling would draw for nothing)."""
        return 0 < self.last_step <= self.target_upto_future_step

    def set_local_target(self, train_step: int, task_sizes: dict[str, int]) -> None:
        """Colocated mode: the target is exactly one batch beyond what was consumed."""
        for task, n in task_sizes.items():
            self.target_samples[task] = self.consumed_samples[task] + n
        self.target_upto_future_step = train_step
        self.producer_future_step = train_step

    def begin_consume(self, train_step: int) -> None:
        self.next_consumer_step = train_step

    def mark_consumed(self, counts: dict[str, int]) -> None:
        for task, n in counts.items():
            self.consumed_samples[task] += n

    def finish_consume(self, train_step: int) -> None:
        self.next_consumer_step = train_step + 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_consumer_step": self.next_consumer_step,
            "producer_future_step": self.producer_future_step,
            "target_upto_future_step": self.target_upto_future_step,
            "consumed_samples": dict(self.consumed_samples),
            "target_samples": dict(self.target_samples),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # In place: contexts hold references to these dicts.
        missing = set(self.consumed_samples) - set(state["consumed_samples"])
        if missing:
            raise KeyError(f"progress state lacks tasks {sorted(missing)} (has {sorted(state['consumed_samples'])})")
        self.next_consumer_step = state["next_consumer_step"]
        self.producer_future_step = state["producer_future_step"]
        self.target_upto_future_step = state["target_upto_future_step"]
        self.consumed_samples.clear()
        self.consumed_samples.update(state["consumed_samples"])
        self.target_samples.clear()
        self.target_samples.update(state["target_samples"])
