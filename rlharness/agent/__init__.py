"""Agent loops: how a group of prompt copies becomes judged responses (`agent=<name>`).

Light on purpose: the gateway's agent processes import `rlharness.agent.agent_worker`, which
must not pull in torch; the loops themselves are imported where they are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rlharness.agent.base import AgentLoop


def build_agent_loop(conf, engine, judger, decode: Callable[[list[int]], str],
                     encode: Callable[[str], list[int]] | None = None, tokenizer=None) -> "AgentLoop":
    """The loop `conf.name` names (rlharness/config/registry.py); `encode` and `tokenizer` as
    `AgentLoop` takes them."""
    from rlharness.config import registry

    return registry.build("agent", conf, engine, judger, decode, encode=encode, tokenizer=tokenizer)


def __getattr__(name: str) -> Any:
    if name == "AgentLoop":
        from rlharness.agent.base import AgentLoop

        return AgentLoop
    raise AttributeError(name)


__all__ = ["AgentLoop", "build_agent_loop"]
