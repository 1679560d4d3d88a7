"""The calculator agent of examples/gateway_calculator_agent.py, written against the OpenAI Responses API.

`client.responses.create` with function tools; the program sends the whole conversation each time
(`input`: its messages, the response's output items, `function_call_output` items), since the
gateway keeps no responses (`previous_response_id` is refused). The tokens trained are those the
chat-completions version trains on the same seeds (tests/agent/test_gateway_protocols.py).

    python train.py experiment=gateway_tools agent.entrypoint=examples.gateway_responses_agent:run
"""

from __future__ import annotations

from openai import AsyncOpenAI

from examples.gateway_calculator_agent import MAX_CALLS, run_tool

TOOLS = [{
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}]


async def run(row: dict, client: AsyncOpenAI) -> str:
    items: list = [{"role": "user", "content": row["prompt"]}]
    text = ""
    for _ in range(MAX_CALLS):
        response = await client.responses.create(model=row["model"], input=items, tools=TOOLS)
        text = response.output_text
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items += [{"type": "function_call_output", "call_id": call.call_id, "output": run_tool(call.arguments)}
                  for call in calls]
    return text
