"""Agent programs for tests/agent/test_openai_gateway.py (named by `agent.entrypoint`).

Each is an ordinary `openai.AsyncOpenAI` program; what it saw is kept in `SEEN` (by sample uid)
for the tests to check.
"""

from __future__ import annotations

import asyncio

import httpx
import openai

SEEN: dict[str, dict] = {}
CANCELLED: list[str] = []


def ask(row: dict) -> list[dict]:
    return [{"role": "user", "content": row["prompt"]}]


async def refused_then_served(row: dict, client: openai.AsyncOpenAI) -> str:
    """Every request the gateway refuses, each answered with its status; then one good call."""
    seen = SEEN.setdefault(row["uid"], {"status": {}})
    bad = {
        "model": dict(model="gpt-4o"),
        "temperature": dict(model=row["model"], temperature=0.5),
        "n": dict(model=row["model"], n=2),
        "max_tokens": dict(model=row["model"], max_tokens=10_000),
        "stream": dict(model=row["model"], stream=True),
        "top_p": dict(model=row["model"], top_p=0.5),
        "stop": dict(model=row["model"], stop=["\n"]),
        "seed": dict(model=row["model"], seed=3),
        "logprobs": dict(model=row["model"], logprobs=True),
    }
    for name, kwargs in bad.items():
        try:
            await client.chat.completions.create(messages=ask(row), **kwargs)
        except openai.APIStatusError as exc:
            seen["status"][name] = (exc.status_code, exc.body)
    base = str(client.base_url).rstrip("/")
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{base}/chat/completions", content=b'{"model": "policy", "messages": [',
                            headers={"content-type": "application/json"})
        seen["status"]["malformed"] = (r.status_code, r.json())
        r = await http.post(base.rsplit("/rollout/", 1)[0] + "/rollout/nobody/v1/chat/completions",
                            json={"model": row["model"], "messages": ask(row)})
        seen["status"]["rollout"] = (r.status_code, r.json())
    seen["models"] = [m.id for m in (await client.models.list()).data]
    response = await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=8,
                                                     temperature=1.0)
    seen["finish_reason"] = response.choices[0].finish_reason
    seen["usage"] = response.usage.model_dump()
    return response.choices[0].message.content


async def edits_history(row: dict, client: openai.AsyncOpenAI) -> str:
    """Two calls; the second sends back an assistant message other than the one the model wrote."""
    messages = ask(row)
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": "I rewrote this." + (first.choices[0].message.content or "")},
                 {"role": "user", "content": "Again?"}]
    second = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=6)
    SEEN[row["uid"]] = {"messages": messages}
    return second.choices[0].message.content or ""


async def completes_text(row: dict, client: openai.AsyncOpenAI) -> str:
    """The legacy completions endpoint, continued by a second call on its own text."""
    first = await client.completions.create(model=row["model"], prompt=row["prompt"], max_tokens=5)
    second = await client.completions.create(model=row["model"], prompt=row["prompt"] + first.choices[0].text,
                                             max_tokens=5)
    SEEN[row["uid"]] = {"texts": [first.choices[0].text, second.choices[0].text]}
    return first.choices[0].text + second.choices[0].text


async def crashes(row: dict, client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    raise RuntimeError(f"the agent's own bug on {row['prompt'][:12]!r}")


async def crashes_on_marked_prompts(row: dict, client: openai.AsyncOpenAI) -> str:
    """Crashes on prompts that say CRASH; runs the example agent on the others."""
    if "CRASH" in row["prompt"]:
        raise RuntimeError(f"the agent's own bug on prompt {row['index']}")
    from examples.gateway_calculator_agent import run

    return await run(row, client)


async def hangs(row: dict, client: openai.AsyncOpenAI) -> str:
    try:
        await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
        await asyncio.Event().wait()  # for ever: only the agent's timeout ends it
    finally:
        CANCELLED.append(row["prompt"])
    return ""


not_callable = 42


RUNNING = {"now": 0, "most": 0, "expect": 1}


async def counts_company(row: dict, client: openai.AsyncOpenAI) -> str:
    """One call, counting how many programs run at the same time: each waits until `expect` of them
    run (the test's max_concurrency; programs run one at a time would wait for ever)."""
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    try:
        while RUNNING["now"] < RUNNING["expect"]:
            await asyncio.sleep(0.005)
        response = await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=3)
        return response.choices[0].message.content or ""
    finally:
        RUNNING["now"] -= 1
