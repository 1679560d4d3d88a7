"""Format judger: 1 when the whole response matches a regular expression, else 0.

The pattern is the user's and the text the model's: a pattern that backtracks catastrophically
(`(.|.)*X`) must not stall the event loop. It is matched with `regex` (re's syntax; it finds most such
matches in microseconds): inline under `INLINE_TIMEOUT_S`, and past that in a judging process, which is
killed at `agent.judge_timeout_s` like any slow judgement.
"""

from __future__ import annotations

from typing import Any

import regex

from rlharness.config.schema import ConfigError, FormatJudgerConf
from rlharness.judger.base import Judger

INLINE_TIMEOUT_S = 0.01  # the most one inline match may hold the event loop


def compile_pattern(pattern: str, key: str) -> regex.Pattern:
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise ConfigError(f"{key}={pattern!r} is not a valid regular expression: {exc}") from None


class FormatJudger(Judger):
    name = "format"

    def __init__(self, conf: FormatJudgerConf | None = None, key: str = "judger.pattern"):
        self.conf = conf or FormatJudgerConf()
        self.pattern = compile_pattern(self.conf.pattern, key)

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return {"score": 1.0 if self.pattern.fullmatch(response_text) else 0.0}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        try:
            return {"score": 1.0 if self.pattern.fullmatch(response_text, timeout=INLINE_TIMEOUT_S) else 0.0}
        except TimeoutError:  # a slow match: the judging processes, under the judging timeout
            return None
