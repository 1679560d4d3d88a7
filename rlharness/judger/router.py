"""Router judger: a weighted sum of several judgers' scores.

reward = {"score": sum(w_i * s_i), "<name_i>": s_i, ...}: each part keeps its own
score under its name, so logs can show which part moved.

Parts: the rule judgers (math, countdown, format), scored together in the router's judging
processes, and the learned ones (reward_model, llm; their configs under `judger.reward_model`
and `judger.llm`), each scoring the whole group its own way (rlharness/judger/reward_model.py,
llm.py) at the same time. A learned part that fails or times out fails the group
(or scores 0, as its own `on_timeout` says).
"""

from __future__ import annotations

from typing import Any, Callable

from rlharness.config.schema import (ConfigError, CountdownJudgerConf, FormatJudgerConf,
                                     MathJudgerConf, RouterJudgerConf)
from rlharness.judger.base import Judger, gather_fail_fast
from rlharness.judger.countdown import CountdownJudger
from rlharness.judger.format import FormatJudger
from rlharness.judger.math import MathJudger
from rlharness.core.types import RolloutState

LEARNED = ("reward_model", "llm")
ROUTABLE = ("math", "countdown", "format", *LEARNED)


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
        from rlharness.config import registry  # a learned part is built as any judger is

        self.conf = conf or RouterJudgerConf()
        if not self.conf.weights:
            raise ConfigError("judger.weights is empty: name at least one judger and its weight")
        self.parts = {name: _build_part(name, self.conf) for name in self.conf.weights if name not in LEARNED}
        self.learned = {name: registry.build("judger", getattr(self.conf, name))
                        for name in self.conf.weights if name in LEARNED}
        self.label_keys = tuple(dict.fromkeys(k for j in self.parts.values() for k in j.label_keys))

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return self._combine({name: float(j.score(response_text, label)["score"]) for name, j in self.parts.items()})

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        """Inline only when every part answers inline (never with a learned part)."""
        return None if self.learned else self._rules_inline(response_text, label)

    def _rules_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        parts = {}
        for name, j in self.parts.items():
            r = j.score_inline(response_text, label)
            if r is None:
                return None
            parts[name] = float(r["score"])
        return self._combine(parts)

    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        if not self.learned:
            return await super().score_slow(members, timeout_s)
        names = list(self.learned)
        jobs = [self.learned[n].score_slow(members, timeout_s) for n in names]
        rules = [self._rules_inline(s.response_text, s.label) for s in members]
        if any(r is None for r in rules):  # the rule parts in the judging processes (no learned part there)
            names.append("")
            jobs.append(super().score_slow(members, timeout_s))
        results = dict(zip(names, await gather_fail_fast(jobs)))
        rules = results.pop("", rules)
        return [self._combine({**{k: v for k, v in rules[i].items() if k != "score"},
                               **{n: float(r[i]["score"]) for n, r in results.items()}})
                for i in range(len(members))]

    def _combine(self, parts: dict[str, float]) -> dict[str, float]:
        total = sum(self.conf.weights[name] * s for name, s in parts.items())
        return {"score": total, **parts}

    def check_sample(self, prompt_text: str, label: dict[str, Any], timeout_s: float, key: str, where: str) -> None:
        for name, part in self.learned.items():
            part.check_sample(prompt_text, label, timeout_s, f"{key}.{name}", where)

    def stats(self) -> dict[str, float]:
        """The router's counts plus its learned parts' (their timeouts, judge/unparseable...)."""
        out = super().stats()
        for part in self.learned.values():
            for k, v in part.stats().items():
                out[k] = out.get(k, 0.0) + v
        return out

    async def close(self) -> None:
        try:
            for part in self.learned.values():
                await part.close()
        finally:
            await super().close()

    def __getstate__(self) -> dict[str, Any]:
        # A judging process scores the rule parts only; the learned parts stay in the trainer.
        return {**super().__getstate__(), "learned": {}}

