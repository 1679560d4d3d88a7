"""Tasks: prompt lists (train, eval) with labels for the judger. `build_task` picks one by name."""

from __future__ import annotations

from rlharness.config.schema import ConfigError, TaskConf
from rlharness.data.base import PromptRow, TaskData

TASKS = ("arithmetic", "countdown", "jsonl", "reasoning_gym")


def build_task(conf: TaskConf, tokenizer=None) -> TaskData:
    """The task named by `conf.name`; `tokenizer` is used for chat templates (task=jsonl, reasoning_gym)."""
    if conf.name == "arithmetic":
        from rlharness.data.arithmetic import make_arithmetic_task

        return make_arithmetic_task(conf)
    if conf.name == "countdown":
        from rlharness.data.countdown import make_countdown_task

        return make_countdown_task(conf)
    if conf.name == "jsonl":
        from rlharness.data.jsonl import load_jsonl_task

        return load_jsonl_task(conf, tokenizer)
    if conf.name == "reasoning_gym":
        from rlharness.data.reasoning_gym import make_reasoning_gym_task

        return make_reasoning_gym_task(conf, tokenizer)
    raise ConfigError(f"task.name={conf.name!r} is not allowed: expected one of {', '.join(TASKS)}")


__all__ = ["PromptRow", "TaskData", "TASKS", "build_task"]
