"""Tasks: prompt lists (train, eval) with labels for the judger. `build_task` makes the one `task.name` names."""

from __future__ import annotations

from rlharness.config import registry
from rlharness.config.schema import TaskConf
from rlharness.data.base import PromptRow, TaskData

def build_task(conf: TaskConf, tokenizer=None) -> TaskData:
    """The task `conf.name` names (rlharness/config/registry.py); `tokenizer` is used for chat
    templates (task=jsonl, reasoning_gym)."""
    return registry.build("task", conf, tokenizer)


__all__ = ["PromptRow", "TaskData", "build_task"]
