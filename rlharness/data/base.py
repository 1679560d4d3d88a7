"""A task is a named pair of prompt lists (train, eval) plus the judger that scores them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptRow:
    index: int  # position in its split
    prompt_text: str  # final text given to the tokenizer (templates already applied)
    label: dict[str, Any] = field(default_factory=dict)  # ground truth for the judger
    source: str = ""  # where the row came from ("file.jsonl:12"), for messages; "" for generated tasks


@dataclass
class TaskData:
    name: str
    train: list[PromptRow]
    eval: list[PromptRow]
