"""What the gateway's test files share: the embedded chat model, groups of its tool task, a gateway loop
backed by the real hf engine, and running groups through it."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlharness.agent import build_agent_loop
from rlharness.config.schema import MathJudgerConf, ModelConf, OpenAIGatewayAgentConf, SamplingConf
from rlharness.core.types import make_group
from rlharness.engine.hf import HFEngine
from rlharness.judger.math import MathJudger
from rlharness.model.load import PROJECT_ROOT, load_model, load_tokenizer, text_codec

ASSET = PROJECT_ROOT / "assets" / "tiny-chat"
MODEL = ModelConf(path=str(ASSET))
TOK = load_tokenizer(MODEL)
ENCODE, DECODE = text_codec(TOK)
ROWS = [json.loads(line) for line in (ASSET / "data" / "tools_train.jsonl").read_text().splitlines()[:4]]
AGENTS = "tests.agent.gateway_agents:"


@pytest.fixture(scope="module")
def model():
    """The embedded chat model (import this fixture into a test module that uses it)."""
    return load_model(MODEL)


def chat(question: str) -> str:
    return TOK.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)


def group_of(i: int, k: int, templated: bool = False):
    q = ROWS[i]["question"]
    return make_group(task="t", prompt_index=i, epoch=0, prompt_text=chat(q) if templated else q,
                      prompt_ids=ENCODE(chat(q)), label={"answer": ROWS[i]["answer"].rsplit("####", 1)[1].strip()},
                      k=k, seed=5)


def gateway(entrypoint: str, **kw) -> OpenAIGatewayAgentConf:
    return OpenAIGatewayAgentConf(entrypoint=entrypoint, sampling=SamplingConf(max_tokens=40), **kw)


def make_loop(conf, engine):
    return build_agent_loop(conf, engine, MathJudger(MathJudgerConf(fallback_last_number=False)), DECODE,
                            encode=lambda t: TOK.encode(t, add_special_tokens=False), tokenizer=TOK)


def run_groups(model, conf, groups, concurrently: bool = False):
    """(the loop, the groups generated), one after the other or all at once; the loop closed after."""
    async def go():
        engine = HFEngine.from_model(model, TOK)
        loop = make_loop(conf, engine)
        try:
            if concurrently:
                return loop, list(await asyncio.gather(*(loop.generate_group(g, enable_partial_rollout=True)
                                                         for g in groups)))
            return loop, [await loop.generate_group(g, enable_partial_rollout=True) for g in groups]
        finally:
            await loop.close()
            await engine.close()
    return asyncio.run(go())


def group_asking(question: str, k: int, index: int = 0, answer: str = "6"):
    """A group of `k` copies of a question of our own (hostile programs read their orders from it)."""
    return make_group(task="t", prompt_index=index, epoch=0, prompt_text=question, prompt_ids=ENCODE(chat(question)),
                      label={"answer": answer}, k=k, seed=5)
