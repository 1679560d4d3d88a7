"""What a built run hands the trainer: the parts `rlharness.launch.build` made, by role."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Components:
    tokenizer: Any
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    task_data: dict[str, Any]  # task name -> TaskData
    judgers: dict[str, Any]  # task name -> Judger
    engine: Any
    manager: Any
    backend: Any
    weights: Any  # the weight channel: `await weights.sync(version)` (rlharness/distributed/weight_channel.py)
    evaluator: Any
    # task name -> the judger eval scores with, where it is not the training one (a learned reward).
    eval_judgers: dict[str, Any] = field(default_factory=dict)
    # task name -> the distillation teacher scoring its groups (rlharness/teacher/); tasks without one absent.
    teachers: dict[str, Any] = field(default_factory=dict)

    def distinct_teachers(self) -> list[Any]:
        """Each teacher once (tasks may share one)."""
        return list({id(t): t for t in self.teachers.values()}.values())
