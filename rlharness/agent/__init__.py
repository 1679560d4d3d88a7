"""Agent loops: how a group of prompt copies becomes judged responses (`agent=<name>`)."""

from __future__ import annotations

from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.config import registry
from rlharness.config.schema import AgentConf
from rlharness.engine.base import RolloutEngine
from rlharness.judger.base import Judger


def build_agent_loop(conf: AgentConf, engine: RolloutEngine, judger: Judger,
                     decode: Callable[[list[int]], str],
                     encode: Callable[[str], list[int]] | None = None, tokenizer=None) -> AgentLoop:
    """The loop `conf.name` names (rlharness/config/registry.py); `encode` and `tokenizer` as
    `AgentLoop` takes them."""
    return registry.build("agent", conf, engine, judger, decode, encode=encode, tokenizer=tokenizer)


__all__ = ["AgentLoop", "build_agent_loop"]
