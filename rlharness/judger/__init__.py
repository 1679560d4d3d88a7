"""Judgers: response -> reward["score"]. `build_judger` picks one by `conf.name`."""

from __future__ import annotations

from typing import Any

from rlharness.config import registry
from rlharness.config.schema import ConfigError, JudgerConf
from rlharness.judger.base import Judger


def build_judger(conf: JudgerConf) -> Judger:
    """The judger `conf.name` names (rlharness/config/registry.py)."""
    return registry.build("judger", conf)


def learned_judgers(run_conf) -> list[tuple[str, Any]]:
    """(key, conf) of each task's learned judger (a reward model or an LLM judge), router parts included."""
    from rlharness.config.schema import LLMJudgerConf, RewardModelJudgerConf, RouterJudgerConf

    found = []
    for name, entry in run_conf.task_entries().items():
        key = f"tasks.{name}.judger" if run_conf.tasks else "judger"
        conf = run_conf.judger_for(entry)
        parts = [(key, conf)]
        if isinstance(conf, RouterJudgerConf):
            parts = [(f"{key}.{n}", getattr(conf, n)) for n in ("reward_model", "llm") if n in conf.weights]
        found += [(k, part) for k, part in parts if isinstance(part, (RewardModelJudgerConf, LLMJudgerConf))]
    return found


def check_learned_judgers(run_conf) -> None:
    """Refuse, before a run starts, a learned judger's model folder it cannot use (each task's judger,
    router parts included): a reward model that is not a sequence classifier or whose logit is
    ambiguous; a judge model folder that does not exist; weights that are unreadable, hold code or do
    not fit the folder's config.json."""
    from rlharness.config.schema import RewardModelJudgerConf

    for part_key, part in learned_judgers(run_conf):
        if isinstance(part, RewardModelJudgerConf):
            from rlharness.judger.reward_model import check_reward_model

            check_reward_model(part, part_key)
        else:
            from rlharness.judger.reward_model import model_folder
            from rlharness.model.weight_files import WeightFileError, check_weights

            try:
                check_weights(model_folder(part, part_key), trust_remote_code=part.trust_remote_code)
            except WeightFileError as exc:
                raise ConfigError(f"{part_key}.path={part.path}: {exc}") from None


__all__ = ["Judger", "build_judger", "check_learned_judgers", "learned_judgers"]
