"""RolloutEngine.generate_many: one call for a group's requests, with generate's contract per request."""

from __future__ import annotations

import asyncio

import pytest

from rlharness.agent.single_turn import SingleTurnAgentLoop
from rlharness.config.schema import SamplingConf, SimEngineConf, SingleTurnAgentConf
from rlharness.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlharness.engine.sim import SimEngine
from rlharness.judger.format import FormatJudger
from rlharness.core.types import Status, make_group
from tests.helpers import run_on_virtual_clock


def _engine(**kw) -> SimEngine:
    conf = dict(mean_response_len=20, cv=0.5, time_per_token_s=1e-3, slots=8)
    conf.update(kw)
    return SimEngine(SimEngineConf(**conf), seed=0, vocab_size=20)


def _req(i: int, max_tokens: int = 64) -> GenerateRequest:
    return GenerateRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=max_tokens), seed=i)


@pytest.mark.timeout(30)
def test_default_generate_many_returns_results_in_request_order():
    async def main():
        return await _engine().generate_many([_req(i) for i in range(6)])

    results = asyncio.run(main())
    assert [r.request_id for r in results] == [f"r{i}" for i in range(6)]
    assert all(r.finish_reason in ("stop", "length") and len(r.token_ids) == len(r.logprobs) for r in results)


@pytest.mark.timeout(30)
def test_abort_during_generate_many_returns_each_partial_response():
    async def main():  # on a virtual clock: the abort lands 0.05 s into 1 s responses on any machine
        engine = _engine(mean_response_len=1000, cv=0.1, time_per_token_s=1e-3)
        call = asyncio.ensure_future(engine.generate_many([_req(i, max_tokens=2000) for i in range(3)]))
        await asyncio.sleep(0.05)
        await engine.abort_all()
        return await asyncio.wait_for(call, 10)

    results = run_on_virtual_clock(main())
    assert [r.finish_reason for r in results] == ["abort"] * 3
    assert all(0 < len(r.token_ids) < 2000 for r in results)


class _CountingEngine(SimEngine):
    """A SimEngine that answers a group in one native call (counts calls; no per-request tasks)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.many_calls: list[int] = []
        self.single_calls = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.single_calls += 1
        return await super().generate(request)

    async def generate_many(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        self.many_calls.append(len(requests))
        return [await super(_CountingEngine, self).generate(r) for r in requests]


@pytest.mark.timeout(30)
def test_single_turn_agent_sends_a_group_in_one_generate_many_call():
    engine = _CountingEngine(SimEngineConf(mean_response_len=5, cv=0.5, time_per_token_s=1e-4), seed=0, vocab_size=20)
    agent = SingleTurnAgentLoop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=16)), engine,
                                FormatJudger(), lambda ids: " ".join(map(str, ids)))
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1, 2], label={}, k=4)
    out = asyncio.run(agent.generate_group(group, enable_partial_rollout=False))
    assert engine.many_calls == [4] and engine.single_calls == 0
    assert all(s.status == Status.COMPLETED and s.reward is not None and s.response_ids for s in out)
    assert all(a is b for a, b in zip(out, group))  # generated in place
