"""Prompt length, checked when the data is loaded (never discovered by the engine mid-run).

A prompt may take at most `task.max_prompt_tokens` tokens; 0 means the model's
positions (`max_position_embeddings` in its config) minus the response budget
(`agent.sampling.max_tokens`, or `eval.max_tokens` for the eval split). Prompts over
the limit are refused (`task.long_prompts=refuse`: a ConfigError with their count
and the first one's `file:line` and length) or left out with a warning saying the
same (`drop`).

Counting every prompt with the tokenizer would cost minutes on big files (and one
10 MB row alone can take minutes), so bounds decide first: a prompt of B UTF-8 bytes
has at most B + a few tokens (no tokenizer makes more than one token per byte, plus
special tokens), and at least chars / (longest vocabulary entry) tokens. Only a
prompt between the two is encoded.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

from rlharness.config.schema import ConfigError
from rlharness.data.base import PromptRow, TaskData

log = logging.getLogger(__name__)

# Tokens a tokenizer may add beyond one per byte (BOS/EOS, a sentencepiece prefix).
_SPECIAL_SLACK = 8


def model_positions(model_config) -> int | None:
    """The most positions the model can attend over, from its Hugging Face config (None if unknown)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_token_limit(max_prompt_tokens: int, positions: int | None, response_tokens: int, split: str) -> int | None:
    """The limit for one split; None when neither the user nor the model gives one."""
    if max_prompt_tokens > 0:
        return max_prompt_tokens
    if positions is None:
        return None
    limit = positions - response_tokens
    if limit < 1:
        key = "eval.max_tokens" if split == "eval" else "agent.sampling.max_tokens"
        raise ConfigError(f"{key}={response_tokens} leaves no room for a prompt in the model's {positions} positions")
    return limit


class PromptMeter:
    """Decides `len(encode(text)) > limit`, encoding only when the cheap bounds cannot tell."""

    def __init__(self, encode: Callable[[str], list[int]], longest_token_chars: int):
        self.encode = encode
        self.longest_token_chars = max(1, longest_token_chars)

    def excess(self, text: str, limit: int) -> tuple[int, bool] | None:
        """None if `text` fits in `limit` tokens, else (tokens, exact): exact False means "at least"."""
        if len(text.encode("utf-8")) + _SPECIAL_SLACK <= limit:
            return None
        at_least = len(text) // self.longest_token_chars
        if at_least > limit:
            return at_least, False
        n = len(self.encode(text))
        return (n, True) if n > limit else None


def check_split(rows: list[PromptRow], split: str, task: str, limit: int, meter: PromptMeter,
                policy: str) -> list[PromptRow]:
    """`rows` without those over `limit` (policy "drop"), or ConfigError naming them (policy "refuse")."""
    over = []
    for row in rows:
        found = meter.excess(row.prompt_text, limit)
        if found is not None:
            over.append((row, found))
    if not over:
        return rows
    row, (n, exact) = over[0]
    where = row.source or f"task {task} {split} row {row.index}"
    what = (f"{len(over)} of {len(rows)} {split} prompts of task {task} are longer than task.max_prompt_tokens="
            f"{limit} (first: {where}, {'' if exact else 'at least '}{n} tokens)")
    if policy == "refuse" or len(over) == len(rows):
        hint = ("set task.long_prompts=drop to leave them out, raise task.max_prompt_tokens, or shorten them"
                if policy == "refuse" else "none would be left")
        raise ConfigError(f"{what}: {hint}")
    log.warning("%s: left out (task.long_prompts=drop)", what)
    dropped = {id(r) for r, _ in over}
    return [r for r in rows if id(r) not in dropped]


def fit_prompts(task_data: TaskData, *, max_prompt_tokens: int, policy: str, positions: int | None,
                train_response_tokens: int, eval_response_tokens: int, encode: Callable[[str], list[int]],
                longest_token_chars: int) -> TaskData:
    """The task's splits checked against their limits (see the module docstring)."""
    meter = PromptMeter(encode, longest_token_chars)
    splits = {}
    for split, rows, response_tokens in (("train", task_data.train, train_response_tokens),
                                         ("eval", task_data.eval, eval_response_tokens)):
        limit = prompt_token_limit(max_prompt_tokens, positions, response_tokens, split)
        if limit is None:
            log.warning("task %s: the model's config gives no context length and task.max_prompt_tokens=0: "
                        "prompt lengths are not checked", task_data.name)
            return task_data
        splits[split] = check_split(list(rows), split, task_data.name, limit, meter, policy)
    return replace(task_data, train=splits["train"], eval=splits["eval"])


def longest_prompt_tokens(rows: list[PromptRow], encode: Callable[[str], list[int]]) -> int:
    """The most tokens any row's prompt encodes to. A prompt of B UTF-8 bytes has at most B + a few
    tokens, so rows are encoded longest (in bytes) first until the next cannot beat the longest found."""
    best = 0
    for row in sorted(rows, key=lambda r: len(r.prompt_text.encode("utf-8")), reverse=True):
        if len(row.prompt_text.encode("utf-8")) + _SPECIAL_SLACK <= best:
            break
        best = max(best, len(encode(row.prompt_text)))
    return best
