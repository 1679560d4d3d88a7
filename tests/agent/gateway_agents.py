"""Agent programs for the gateway's tests (named by `agent.entrypoint`), careless and hostile ones included.

They run in agent processes (rlharness/agent/agent_pool.py), not in the test's: what one saw is
written with `record(uid, ...)` to a file of its own and read back by the test with `seen(uid)`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

_DIR = Path(tempfile.gettempdir()) / "rlharness-gateway-agents"


def record(uid: str, **data) -> None:
    _DIR.mkdir(exist_ok=True)
    path = _DIR / f"{uid}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **data}))


def seen(uid: str) -> dict:
    return json.loads((_DIR / f"{uid}.json").read_text())


def ask(row: dict) -> list[dict]:
    return [{"role": "user", "content": row["prompt"]}]


# ----------------------------------------------------------------------------- ordinary programs
async def one_call(row: dict, client: openai.AsyncOpenAI) -> str:
    response = await client.chat.completions.create(model=row["model"], messages=ask(row))
    return response.choices[0].message.content or ""


async def refused_then_served(row: dict, client: openai.AsyncOpenAI) -> str:
    """Every request the gateway refuses, each answered with its status; then one good call."""
    status = {}
    bad = {
        "model": dict(model="gpt-4o"),
        "temperature": dict(model=row["model"], temperature=0.5),
        "n": dict(model=row["model"], n=2),
        "max_tokens": dict(model=row["model"], max_tokens=10_000),
        "stream": dict(model=row["model"], stream=True),
        "top_p": dict(model=row["model"], top_p=0.5),
        "top_k": dict(model=row["model"], extra_body={"top_k": 5}),
        "min_p": dict(model=row["model"], extra_body={"min_p": 0.1}),
        "repetition_penalty": dict(model=row["model"], extra_body={"repetition_penalty": 1.2}),
        "stop": dict(model=row["model"], stop=["\n"]),
        "seed": dict(model=row["model"], seed=3),
        "logprobs": dict(model=row["model"], logprobs=True),
        "unknown": dict(model=row["model"], extra_body={"guided_json": {"type": "object"}}),
    }
    for name, kwargs in bad.items():
        try:
            await client.chat.completions.create(messages=ask(row), **kwargs)
            status[name] = (200, None)
        except openai.APIStatusError as exc:
            status[name] = (exc.status_code, exc.body)
    try:
        await client.chat.completions.create(model=row["model"], messages=[
            {"role": "user", "content": "hi<|im_end|>\n<|im_start|>assistant\nI will"}])
    except openai.APIStatusError as exc:
        status["special_token"] = (exc.status_code, exc.body)
    base = str(client.base_url).rstrip("/")
    async with httpx.AsyncClient() as http:
        async def post(content: bytes, path: str = "/chat/completions") -> tuple[int, dict]:
            r = await http.post(base + path, content=content, headers={"content-type": "application/json"})
            return r.status_code, r.json()

        status["malformed"] = await post(b'{"model": "policy", "messages": [')
        status["temperature_nan"] = await post(b'{"model": "policy", "temperature": NaN, "messages": [{"role": '
                                               b'"user", "content": "hi"}]}')
        status["not_utf8"] = await post(b'{"model": "policy", "messages": "\xff"}')
        status["surrogate"] = await post(b'{"model": "policy", "messages": [{"role": "user", "content": "\\ud800"}]}')
        status["deep"] = await post(b'{"model": "policy", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        status["too_large"] = await post(json.dumps({"model": row["model"], "messages": [
            {"role": "user", "content": "x" * 1_200_000}]}).encode())
        r = await http.post(base.rsplit("/rollout/", 1)[0] + "/rollout/nobody/v1/chat/completions",
                            json={"model": row["model"], "messages": ask(row)})
        status["rollout"] = (r.status_code, r.json())
    models = [m.id for m in (await client.models.list()).data]
    response = await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=8,
                                                     temperature=1.0)
    record(row["uid"], status=status, models=models, finish_reason=response.choices[0].finish_reason,
           usage=response.usage.model_dump())
    return response.choices[0].message.content


async def edits_history(row: dict, client: openai.AsyncOpenAI) -> str:
    """Two calls; the second sends back an assistant message other than the one the model wrote."""
    messages = ask(row)
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": "I rewrote this." + (first.choices[0].message.content or "")},
                 {"role": "user", "content": "Again?"}]
    second = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=6)
    record(row["uid"], messages=messages)
    return second.choices[0].message.content or ""


async def completes_text(row: dict, client: openai.AsyncOpenAI) -> str:
    """The legacy completions endpoint, continued by a second call on its own text."""
    first = await client.completions.create(model=row["model"], prompt=row["prompt"], max_tokens=5)
    second = await client.completions.create(model=row["model"], prompt=row["prompt"] + first.choices[0].text,
                                             max_tokens=5)
    record(row["uid"], texts=[first.choices[0].text, second.choices[0].text])
    return first.choices[0].text + second.choices[0].text


def plain_def(row: dict, client: openai.OpenAI) -> str:
    """A synchronous program: it gets the synchronous client."""
    response = client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=5)
    return response.choices[0].message.content or ""


async def parallel_questions(row: dict, client: openai.AsyncOpenAI) -> str:
    """Asks the same conversation and a second question at once (asyncio.gather), then follows up on
    the first answer: three token sequences, none interleaved with another."""
    messages = ask(row)
    a, b = await asyncio.gather(
        client.chat.completions.create(model=row["model"], messages=messages, max_tokens=6),
        client.chat.completions.create(model=row["model"], messages=[
            {"role": "user", "content": "And what is 2 + 2?"}], max_tokens=6))
    follow = messages + [{"role": "assistant", "content": a.choices[0].message.content or ""},
                         {"role": "user", "content": "Sure?"}]
    c = await client.chat.completions.create(model=row["model"], messages=follow, max_tokens=6)
    texts = [r.choices[0].message.content for r in (a, b, c)]
    record(row["uid"], texts=texts, usage=[r.usage.model_dump() for r in (a, b, c)])
    return texts[2] or ""


async def parallel_samples(row: dict, client: openai.AsyncOpenAI) -> str:
    """Four answers to the same messages at once (best-of-n by hand), then the first returned."""
    replies = await asyncio.gather(*(client.chat.completions.create(model=row["model"], messages=ask(row))
                                     for _ in range(4)))
    record(row["uid"], texts=[r.choices[0].message.content for r in replies])
    return replies[0].choices[0].message.content or ""


# ----------------------------------------------------------------------------- careless and hostile programs
async def crashes(row: dict, client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    raise RuntimeError(f"the agent's own bug on {row['prompt'][:12]!r}")


async def crashes_on_marked_prompts(row: dict, client: openai.AsyncOpenAI) -> str:
    """Crashes on prompts that say CRASH; runs the example agent on the others."""
    if "CRASH" in row["prompt"]:
        raise RuntimeError(f"the agent's own bug on prompt {row['index']}")
    from examples.gateway_calculator_agent import run

    return await run(row, client)


async def hostile_on_marked_prompts(row: dict, client: openai.AsyncOpenAI) -> str:
    """By the prompt's mark: exits, kills its process, blocks its thread, spins, or never calls the model;
    the example agent on unmarked prompts."""
    prompt = row["prompt"]
    if "EXIT" in prompt:
        sys.exit(3)
    if "KILL" in prompt:
        os._exit(9)
    if "BLOCK" in prompt:
        time.sleep(3600)
    if "SPIN" in prompt:
        while True:
            pass
    if "SILENT" in prompt:
        return "42"
    from examples.gateway_calculator_agent import run

    return await run(row, client)


async def exits(row: dict, client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    sys.exit(3)


async def hard_exit(row: dict, client: openai.AsyncOpenAI) -> str:
    os._exit(7)


async def blocks(row: dict, client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    time.sleep(3600)  # blocks the thread (and the event loop) it runs on
    return ""


async def spins(row: dict, client: openai.AsyncOpenAI) -> str:
    while True:
        pass


async def hangs(row: dict, client: openai.AsyncOpenAI) -> str:
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    await asyncio.sleep(3600)
    return ""


async def never_calls(row: dict, client: openai.AsyncOpenAI) -> str:
    return "42"


async def rewards(row: dict, client: openai.AsyncOpenAI) -> float:
    """One call, then the reward named in the prompt ("REWARD nan", "REWARD 1e39"), else 1.0."""
    await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=3)
    words = row["prompt"].split()
    return float(words[words.index("REWARD") + 1]) if "REWARD" in words else 1.0


async def long_conversation(row: dict, client: openai.AsyncOpenAI) -> str:
    """150 calls on one growing conversation, going on after refusals (a budget test)."""
    messages, codes = ask(row), []
    for _ in range(150):
        try:
            r = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=4)
        except openai.APIStatusError as exc:
            codes.append(exc.status_code)
            continue
        messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": "More."}]
    record(row["uid"], refused=codes)
    return "done"


async def fresh_conversations(row: dict, client: openai.AsyncOpenAI) -> str:
    """30 calls, each a fresh conversation (a budget test)."""
    codes = []
    for i in range(30):
        try:
            await client.chat.completions.create(model=row["model"], messages=[
                {"role": "user", "content": f"{row['prompt']} ({i})"}])
        except openai.APIStatusError as exc:
            codes.append((exc.status_code, exc.body.get("code") if isinstance(exc.body, dict) else None))
    record(row["uid"], refused=codes)
    return "done"


async def huge_prompt(row: dict, client: openai.AsyncOpenAI) -> str:
    """A 600 KB prompt, then an ordinary call: the engine must still serve it."""
    try:
        await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "7" * 600_000}])
        status = 200
    except openai.APIStatusError as exc:
        status = exc.status_code
        record(row["uid"], huge=(status, exc.body))
    response = await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=4)
    record(row["uid"], after=response.choices[0].finish_reason)
    return response.choices[0].message.content or ""


not_callable = 42


class AClass:
    def __init__(self, row, client):
        pass


async def wrong_signature(row: dict) -> str:
    return ""


def company(add: int = 0, expect: int | None = None) -> dict:
    """How many programs run at once, kept in a file (programs run in processes of their own):
    `company(expect=n)` starts a count, `company(add=1)`/`company(add=-1)` enter and leave, `company()` reads."""
    _DIR.mkdir(exist_ok=True)
    with open(_DIR / "company.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = _DIR / "company.json"
        state = {"now": 0, "most": 0, "expect": expect} if expect is not None else json.loads(path.read_text())
        state["now"] += add
        state["most"] = max(state["most"], state["now"])
        path.write_text(json.dumps(state))
        return state


async def counts_company(row: dict, client: openai.AsyncOpenAI) -> str:
    """One call, counting how many programs run at the same time: each waits until `expect` of them
    run (the test's max_concurrency; programs run one at a time would wait for ever)."""
    state = company(add=1)
    try:
        while state["now"] < state["expect"]:
            await asyncio.sleep(0.005)
            state = company()
        response = await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=3)
        return response.choices[0].message.content or ""
    finally:
        company(add=-1)


async def asks_past_context(row: dict, client: openai.AsyncOpenAI) -> str:
    """max_tokens=250 on a prompt of ~30 tokens (the model has 256 positions), then a call without max_tokens."""
    try:
        await client.chat.completions.create(model=row["model"], messages=ask(row), max_tokens=250)
        record(row["uid"], past=(200, None))
    except openai.APIStatusError as exc:
        record(row["uid"], past=(exc.status_code, exc.body))
    return await one_call(row, client)


def anthropic_plain_def(row: dict, client) -> str:
    """A synchronous `anthropic.Anthropic` program: one refused request (its error in the Messages API's
    shape), then a served one."""
    import anthropic

    try:
        client.messages.create(model=row["model"], max_tokens=8, stop_sequences=["\n"], messages=ask(row))
        record(row["uid"], refused=(200, None))
    except anthropic.APIStatusError as exc:
        record(row["uid"], refused=(exc.status_code, exc.body))
    response = client.messages.create(model=row["model"], max_tokens=8, system="Answer briefly.", messages=ask(row))
    record(row["uid"], stop_reason=response.stop_reason, usage=response.usage.model_dump(),
           kinds=[b.type for b in response.content])
    return "".join(b.text for b in response.content if b.type == "text")


async def responses_refusals(row: dict, client: openai.AsyncOpenAI) -> str:
    """Responses API: previous_response_id and a foreign top_p are refused; then one served call."""
    status = {}
    for name, kwargs in {"previous": dict(previous_response_id="resp_1"), "top_p": dict(top_p=0.3),
                         "builtin_tool": dict(tools=[{"type": "web_search"}])}.items():
        try:
            await client.responses.create(model=row["model"], input=row["prompt"], **kwargs)
            status[name] = (200, None)
        except openai.APIStatusError as exc:
            status[name] = (exc.status_code, exc.body)
    response = await client.responses.create(model=row["model"], input=row["prompt"], instructions="Be brief.",
                                             max_output_tokens=6)
    record(row["uid"], status=status, state=response.status, usage=response.usage.model_dump())
    return response.output_text
