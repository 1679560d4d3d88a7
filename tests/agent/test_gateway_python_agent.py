"""examples/gateway_python_agent.py: a `python` function tool through the OpenAI tools protocol, its
calls run in the sandbox, trained through the gateway exactly as `agent.tools=[python]` in the
built-in loop trains the same samples (the real hf engine and the embedded code model)."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlharness.agent import build_agent_loop
from rlharness.model.load import text_codec
from rlharness.config.schema import (MathJudgerConf, ModelConf, MultiTurnToolAgentConf, OpenAIGatewayAgentConf,
                                     SamplingConf)
from rlharness.engine.hf import HFEngine
from rlharness.judger.math import MathJudger
from rlharness.model.load import PROJECT_ROOT, load_model, load_tokenizer
from rlharness.sandbox import SandboxUnavailable, check_available
from rlharness.core.types import Status, make_group

pytestmark = pytest.mark.timeout(300)
try:
    check_available()
except SandboxUnavailable as exc:
    pytest.skip(f"sandbox unavailable: {exc}", allow_module_level=True)

ASSET = PROJECT_ROOT / "assets" / "tiny-code"
MODEL = ModelConf(path=str(ASSET))
TOK = load_tokenizer(MODEL)
ENCODE, DECODE = text_codec(TOK)
ROWS = [json.loads(line) for line in (ASSET / "data" / "code_train.jsonl").read_text().splitlines()[:8]]


def group_of(i: int, k: int, templated: bool):
    q = ROWS[i]["question"]
    chat = TOK.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    return make_group(task="t", prompt_index=i, epoch=0, prompt_text=chat if templated else q,
                      prompt_ids=ENCODE(chat), label={"answer": ROWS[i]["answer"].rsplit("####", 1)[1].strip()},
                      k=k, seed=5)


def run_groups(model, conf, groups):
    async def go():
        engine = HFEngine.from_model(model, TOK)
        loop = build_agent_loop(conf, engine, MathJudger(MathJudgerConf(fallback_last_number=False)), DECODE,
                                encode=lambda t: TOK.encode(t, add_special_tokens=False), tokenizer=TOK)
        try:
            return [await loop.generate_group(g, enable_partial_rollout=True) for g in groups]
        finally:
            if hasattr(loop, "server"):
                await loop.close()
            await engine.close()
    return asyncio.run(go())


def test_the_python_agent_trains_exactly_what_the_built_in_python_tool_does():
    model = load_model(MODEL)
    sampling = SamplingConf(max_tokens=80)
    gateway = run_groups(model, OpenAIGatewayAgentConf(entrypoint="examples.gateway_python_agent:run",
                                                       sampling=sampling), [group_of(i, 4, False) for i in range(4)])
    built_in = run_groups(model, MultiTurnToolAgentConf(sampling=sampling, max_turns=2, tools=["python"]),
                          [group_of(i, 4, True) for i in range(4)])
    called = 0
    for g, t in zip(gateway, built_in):
        assert g.status == Status.COMPLETED
        for s, m in zip(g, t):
            assert s.prompt_ids == m.prompt_ids and s.response_ids == m.response_ids
            assert s.response_mask == m.loss_mask() and s.reward == m.reward
            assert s.extra["tool_calls"] == m.extra["tool_calls"]
            if m.extra["tool_calls"]:
                called += 1
                assert ([t["text"] for t in s.extra["turns"] if t["role"] == "tool"]
                        == [t["text"] for t in m.extra["turns"] if t["role"] == "tool"])
                assert [r["stop"] for r in m.extra["tool_results"]] == ["ok"]
    assert called >= 2, "expected the model to call the python tool on some of the 16 samples"
