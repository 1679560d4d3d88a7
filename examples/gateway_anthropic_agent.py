"""The calculator agent of examples/gateway_calculator_agent.py, written against the Anthropic Messages API.

A harness written for the `anthropic` client trains unchanged: `agent.client=anthropic` gives the
program an `anthropic.AsyncAnthropic` on its route at the gateway, which answers `/v1/messages`
with `tool_use` blocks and reads `tool_result` blocks back. The tokens trained are those the
chat-completions version trains on the same seeds (tests/agent/test_gateway_protocols.py).

    python train.py experiment=gateway_tools agent.client=anthropic agent.entrypoint=examples.gateway_anthropic_agent:run
"""

from __future__ import annotations

import json

from anthropic import AsyncAnthropic

from examples.gateway_calculator_agent import MAX_CALLS, run_tool

TOOLS = [{
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}]
MAX_TOKENS = 40  # the Messages API requires one; the gateway holds every call to the sample's budget anyway


async def run(row: dict, client: AsyncAnthropic) -> str:
    messages: list[dict] = [{"role": "user", "content": row["prompt"]}]
    text = ""
    for _ in range(MAX_CALLS):
        response = await client.messages.create(model=row["model"], max_tokens=MAX_TOKENS, messages=messages,
                                                tools=TOOLS)
        text = "".join(block.text for block in response.content if block.type == "text")
        calls = [block for block in response.content if block.type == "tool_use"]
        if not calls:
            break
        messages.append({"role": "assistant", "content": [block.model_dump() for block in response.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": run_tool(json.dumps(call.input))}
            for call in calls]})
    return text
