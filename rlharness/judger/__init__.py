"""Judgers: response -> reward["score"]. `build_judger` picks one by `conf.name`."""

from __future__ import annotations

from rlharness.config.schema import ConfigError, JudgerConf
from rlharness.judger.base import Judger

JUDGERS = ("math", "countdown", "format", "router", "remote", "reasoning_gym")


def build_judger(conf: JudgerConf) -> Judger:
    if conf.name == "math":
        from rlharness.judger.math import MathJudger

        return MathJudger(conf)
    if conf.name == "countdown":
        from rlharness.judger.countdown import CountdownJudger

        return CountdownJudger(conf)
    if conf.name == "format":
        from rlharness.judger.format import FormatJudger

        return FormatJudger(conf)
    if conf.name == "router":
        from rlharness.judger.router import RouterJudger

        return RouterJudger(conf)
    if conf.name == "reasoning_gym":
        from rlharness.judger.reasoning_gym import ReasoningGymJudger

        return ReasoningGymJudger(conf)
    if conf.name == "remote":
        from rlharness.judger.remote import RemoteJudger

        return RemoteJudger(conf)
    raise ConfigError(f"judger.name={conf.name!r} is not allowed: expected one of {', '.join(JUDGERS)}")


__all__ = ["JUDGERS", "Judger", "build_judger"]
