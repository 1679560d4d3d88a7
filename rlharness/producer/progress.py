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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def allocate_batch_sizes(batch_size: int, tasks: list[str]) -> dict[str, int]:
    """Split `batch_size` groups evenly over tasks (the first tasks take the remainder)."""
    if batch_size < len(tasks):
        raise ValueError(f"batch_size={batch_size} is smaller than the number of tasks ({len(tasks)}: {tasks})")
    base, extra = divmod(batch_size, len(tasks))
    return {t: base + (1 if i < extra else 0) for i, t in enumerate(tasks)}


@dataclass
class ProduceProgress:
    next_consumer_step: int = 1
    producer_future_step: int = 1
    target_upto_future_step: int = 0
    consumed_samples: dict[str, int] = field(default_factory=dict)
    target_samples: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, tasks: list[str]) -> "ProduceProgress":
        return cls(consumed_samples={t: 0 for t in tasks}, target_samples={t: 0 for t in tasks})

    def ensure_target_upto(self, future_step: int, task_sizes: dict[str, int]) -> None:
        """Advance the cumulative targets to cover every step up to `future_step`."""
        while self.target_upto_future_step < future_step:
            for task, n in task_sizes.items():
                self.target_samples[task] += n
            self.target_upto_future_step += 1

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
