"""An agent program written against the OpenAI API, trained as it is by `agent=openai_gateway`.

It asks the model the task's question, offering a calculator through function calling; when
the model calls it, the agent evaluates the expression and sends the result back as a tool
message; the model's last answer is returned for the run's judger to score. Nothing here
knows about rlharness except the calculator it borrows (the same one `agent=multi_turn_tool`
runs, so `experiment=gateway_tools` and `experiment=chat_tools` see the same tool outputs).

    python train.py experiment=gateway_tools          # agent.entrypoint=examples.gateway_calculator_agent:run
"""

from __future__ import annotations

import json
from typing import Awaitable, Callable

from openai import AsyncOpenAI

from rlharness.agent.tools import ToolError, calculator

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
MAX_CALLS = 2  # as experiment=chat_tools (agent.max_turns=2): one tool call, then the answer


def run_tool(arguments: str) -> str:
    try:
        return calculator(json.loads(arguments)["expression"])
    except (ToolError, KeyError, TypeError, json.JSONDecodeError) as exc:
        return f"error: {exc}"


async def chat_with_tools(row: dict, client: AsyncOpenAI, tools: list[dict],
                          answer_call: Callable[[str], Awaitable[str]], max_calls: int = MAX_CALLS) -> str:
    """Ask the question offering `tools`; answer each tool call with `await answer_call(arguments)`
    as a tool message; at most `max_calls` model calls. Returns the model's last answer."""
    messages: list[dict] = [{"role": "user", "content": row["prompt"]}]
    content = ""
    for _ in range(max_calls):
        response = await client.chat.completions.create(model=row["model"], messages=messages, tools=tools)
        message = response.choices[0].message
        content = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": await answer_call(call.function.arguments)})
    return content


async def run(row: dict, client: AsyncOpenAI) -> str:
    async def answer(arguments: str) -> str:
        return run_tool(arguments)

    return await chat_with_tools(row, client, TOOLS, answer)
