"""Agent loops: how a group of prompt copies becomes judged responses."""

from __future__ import annotations

from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.config.schema import AgentConf
from rlharness.engine.base import RolloutEngine
from rlharness.judger.base import Judger


def build_agent_loop(conf: AgentConf, engine: RolloutEngine, judger: Judger,
                     decode: Callable[[list[int]], str],
                     encode: Callable[[str], list[int]] | None = None, tokenizer=None) -> AgentLoop:
    """`encode` (text -> ids, no special tokens added) is needed by loops that insert text;
    `tokenizer` (its chat template) by the gateway, which renders the agent's messages."""
    if conf.name == "single_turn":
        from rlharness.agent.single_turn import SingleTurnAgentLoop

        return SingleTurnAgentLoop(conf, engine, judger, decode)
    if conf.name == "multi_turn_tool":
        from rlharness.agent.multi_turn_tool import MultiTurnToolAgentLoop

        if encode is None:
            raise ValueError("agent=multi_turn_tool needs `encode` (it appends tool output as tokens)")
        return MultiTurnToolAgentLoop(conf, engine, judger, decode, encode)
    if conf.name == "openai_gateway":
        from rlharness.agent.openai_gateway import GatewayAgentLoop

        if tokenizer is None:
            raise ValueError("agent=openai_gateway needs the tokenizer (it renders messages with its chat template)")
        return GatewayAgentLoop(conf, engine, judger, decode, tokenizer)
    raise ValueError(f"agent.name={conf.name!r} has no agent loop "
                     f"(available: single_turn, multi_turn_tool, openai_gateway)")


__all__ = ["AgentLoop", "build_agent_loop"]
