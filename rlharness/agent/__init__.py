"""Agent loops: how a group of prompt copies becomes judged responses."""

from __future__ import annotations

from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.config.schema import AgentConf
from rlharness.engine.base import RolloutEngine
from rlharness.judger.base import Judger


def build_agent_loop(conf: AgentConf, engine: RolloutEngine, judger: Judger,
                     decode: Callable[[list[int]], str],
                     encode: Callable[[str], list[int]] | None = None) -> AgentLoop:
    """`encode` (text -> ids, no special tokens added) is needed by loops that insert text."""
    if conf.name == "single_turn":
        from rlharness.agent.single_turn import SingleTurnAgentLoop

        return SingleTurnAgentLoop(conf, engine, judger, decode)
    if conf.name == "multi_turn_tool":
        from rlharness.agent.multi_turn_tool import MultiTurnToolAgentLoop

        if encode is None:
            raise ValueError("agent=multi_turn_tool needs `encode` (it appends tool output as tokens)")
        return MultiTurnToolAgentLoop(conf, engine, judger, decode, encode)
    raise ValueError(f"agent.name={conf.name!r} has no agent loop (available: single_turn, multi_turn_tool)")


__all__ = ["AgentLoop", "build_agent_loop"]
