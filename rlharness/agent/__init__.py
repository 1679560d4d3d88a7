"""Agent loops: how a group of prompt copies becomes judged responses."""

from __future__ import annotations

from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.config.schema import AgentConf
from rlharness.engine.base import RolloutEngine
from rlharness.judger.base import Judger


def build_agent_loop(conf: AgentConf, engine: RolloutEngine, judger: Judger,
                     decode: Callable[[list[int]], str]) -> AgentLoop:
    if conf.name == "single_turn":
        from rlharness.agent.single_turn import SingleTurnAgentLoop

        return SingleTurnAgentLoop(conf, engine, judger, decode)
    raise ValueError(f"agent.name={conf.name!r} has no agent loop (available: single_turn)")


__all__ = ["AgentLoop", "build_agent_loop"]
