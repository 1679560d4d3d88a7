"""A self-consistency agent: the calculator conversation of examples/gateway_calculator_agent.py run
N_PATHS times at once (`asyncio.gather`), and the most frequent final answer returned.

Every path is a conversation of its own, made of parallel calls of one sample: the gateway gives
each call its own token sequence (a branch from the prompt they share) and trains every path as a
row of its own with the sample's reward; nothing is interleaved. The sample's token budget covers
all paths together, so give it room (`agent.max_total_tokens`).

    python train.py experiment=gateway_tools agent.entrypoint=examples.gateway_parallel_agent:run agent.max_total_tokens=160
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

from openai import AsyncOpenAI

from examples.gateway_calculator_agent import TOOLS, chat_with_tools, run_tool

N_PATHS = 4
_ANSWER = re.compile(r"####\s*(-?[\d.,]+)")


async def run(row: dict, client: AsyncOpenAI) -> str:
    async def answer(arguments: str) -> str:
        return run_tool(arguments)

    paths = await asyncio.gather(*(chat_with_tools(row, client, TOOLS, answer) for _ in range(N_PATHS)))
    finals = [m.group(1) for text in paths if (m := _ANSWER.search(text))]
    if not finals:
        return paths[0]
    best, _ = Counter(finals).most_common(1)[0]
    return f"#### {best}"
