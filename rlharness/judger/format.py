"""Format judger: 1 when the whole response matches a regular expression, else 0."""

from __future__ import annotations

import re
from typing import Any

from rlharness.config.schema import ConfigError, FormatJudgerConf
from rlharness.judger.base import Judger


def compile_pattern(pattern: str, key: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{key}={pattern!r} is not a valid regular expression: {exc}") from None


class FormatJudger(Judger):
    name = "format"

    def __init__(self, conf: FormatJudgerConf | None = None, key: str = "judger.pattern"):
        self.conf = conf or FormatJudgerConf()
        self.pattern = compile_pattern(self.conf.pattern, key)

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return {"score": 1.0 if self.pattern.fullmatch(response_text) else 0.0}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        # One regex match. A worker thread would not protect the loop from a pathological pattern
        # anyway: `re` holds the GIL while it matches.
        return self.score(response_text, label)
