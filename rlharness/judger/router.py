"""Router judger: a weighted sum of several rule judgers' scores.

reward = {"score": sum(w_i * s_i), "<name_i>": s_i, ...}: each part keeps its own
score under its name, so logs can show which part moved.
"""

from __future__ import annotations

from typing import Any

from rlharness.config.schema import (ConfigError, CountdownJudgerConf, FormatJudgerConf,
                                     MathJudgerConf, RouterJudgerConf)
from rlharness.judger.base import Judger
from rlharness.judger.countdown import CountdownJudger
from rlharness.judger.format import FormatJudger
from rlharness.judger.math import MathJudger

ROUTABLE = ("math", "countdown", "format")


def _build_part(name: str, conf: RouterJudgerConf) -> Judger:
    if name == "math":
        return MathJudger(MathJudgerConf())
    if name == "countdown":
        return CountdownJudger(CountdownJudgerConf())
    if name == "format":
        return FormatJudger(FormatJudgerConf(pattern=conf.format_pattern), key="judger.format_pattern")
    raise ConfigError(f"judger.weights has {name!r}: expected names among {', '.join(ROUTABLE)}")


class RouterJudger(Judger):
    name = "router"

    def __init__(self, conf: RouterJudgerConf | None = None):
        self.conf = conf or RouterJudgerConf()
        if not self.conf.weights:
            raise ConfigError("judger.weights is empty: name at least one judger and its weight")
        self.parts = {name: _build_part(name, self.conf) for name in self.conf.weights}
        self.label_keys = tuple(dict.fromkeys(k for j in self.parts.values() for k in j.label_keys))

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return self._combine({name: float(j.score(response_text, label)["score"]) for name, j in self.parts.items()})

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        """Inline only when every part answers inline."""
        parts = {}
        for name, j in self.parts.items():
            r = j.score_inline(response_text, label)
            if r is None:
                return None
            parts[name] = float(r["score"])
        return self._combine(parts)

    def _combine(self, parts: dict[str, float]) -> dict[str, float]:
        total = sum(self.conf.weights[name] * s for name, s in parts.items())
        return {"score": total, **parts}
