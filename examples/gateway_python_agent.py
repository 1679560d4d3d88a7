"""An agent program with a Python tool, written against the OpenAI API and trained as it is by `agent=openai_gateway`.

It asks the model the task's question, offering a `python` function (one argument, `code`); when
the model calls it, the agent runs the code in rlharness's sandbox (`rlharness.sandbox.run`: a
process of its own in bubblewrap namespaces, with CPU, memory, process and output limits; see
docs/concepts/sandbox.md) and sends back what it printed, or an error line, as the tool message; the
model's last answer is returned for the run's judger to score. The tool output the model sees is
the same as `agent=multi_turn_tool agent.tools=[python]` shows (`sandbox_output`), so
`experiment=gateway_code` and `experiment=code_tools` see the same tool outputs.

Per sample it makes at most MAX_CALLS model calls (one tool call, then the answer, as
experiment=code_tools's agent.max_turns=2) and spends at most BUDGET_S seconds in the sandbox.
A sandbox that cannot run on this machine is refused when this module is imported (the run
checks agent programs before it starts).

    python train.py experiment=gateway_code          # agent.entrypoint=examples.gateway_python_agent:run
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from openai import AsyncOpenAI

from examples.gateway_calculator_agent import chat_with_tools
from rlharness.agent.tools import sandbox_output
from rlharness.config.schema import SandboxConf
from rlharness.sandbox import check_available, run as run_sandboxed

TOOLS = [{
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program and return what it prints (standard library only, no network).",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}]
MAX_CALLS = 2
BUDGET_S = 30.0
LIMITS = SandboxConf()
check_available(LIMITS)


async def run_tool(arguments: str, budget_s: float) -> tuple[str, float]:
    """(the tool message, the seconds it took); the sandbox call runs in a thread (it blocks)."""
    try:
        code = json.loads(arguments)["code"]
        if not isinstance(code, str):
            raise TypeError("code must be a string")
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        return f"error: {exc}", 0.0
    if budget_s <= 0:
        return f"error: this sample's tool time ({BUDGET_S:g} s) is spent", 0.0
    result = await asyncio.to_thread(run_sandboxed, code, "", replace(LIMITS, wall_s=min(LIMITS.wall_s, budget_s)))
    return sandbox_output(result), result.wall_s


async def run(row: dict, client: AsyncOpenAI) -> str:
    """The conversation loop of examples/gateway_calculator_agent.py, with the python tool and its budget."""
    spent = 0.0

    async def answer(arguments: str) -> str:
        nonlocal spent
        text, seconds = await run_tool(arguments, BUDGET_S - spent)
        spent += seconds
        return text

    return await chat_with_tools(row, client, TOOLS, answer, max_calls=MAX_CALLS)
