"""The single-turn agent loop on the sim engine: generation, abort, continuation token for token, judging."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlharness.agent import build_agent_loop
from rlharness.agent.single_turn import SingleTurnAgentLoop
from rlharness.config.schema import AgentConf, SamplingConf, SimEngineConf, SingleTurnAgentConf
from rlharness.engine.sim import SimEngine
from rlharness.judger.base import Judger
from rlharness.core.types import Status, make_group
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(30)


class FirstTokenParity(Judger):
    name = "parity"

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return {"score": float(int(response_text.split()[0]) % 2 == 0)}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        # On the loop, not in a thread: the tests below run on a virtual clock.
        return self.score(response_text, label)


class Broken(Judger):
    name = "broken"

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        raise RuntimeError("judge down")


def decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def _setup(*, judger=None, mean=40.0, cv=0.0, tpt=0.002, max_tokens=64, k=3):
    engine = SimEngine(SimEngineConf(mean_response_len=mean, cv=cv, time_per_token_s=tpt, slots=16),
                       seed=1, vocab_size=30)
    loop = build_agent_loop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=max_tokens)), engine,
                            judger or FirstTokenParity(), decode)
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[5, 6], label={}, k=k)
    return engine, loop, group


async def _interrupt(loop, group, partial: bool, after_s: float, until=None):
    """Abort once every member's request has run at least `after_s` (and `until(engine stats)` holds).
    Run it on a virtual clock (run_on_virtual_clock): the abort then lands after exactly that much
    generation, on any machine."""
    task = asyncio.create_task(loop.generate_group(group, enable_partial_rollout=partial))
    clock = asyncio.get_running_loop()
    while loop.engine.stats()["in_flight"] < len(group):
        await asyncio.sleep(0.001)
    start = clock.time()
    while clock.time() - start < after_s or (until is not None and not until(loop.engine.stats())):
        await asyncio.sleep(0.001)
    await loop.pause()
    return await task


def test_generates_and_judges_in_place():
    engine, loop, group = _setup(mean=5, cv=1.0, tpt=1e-4)
    out = asyncio.run(loop.generate_group(group, enable_partial_rollout=False))
    assert out.status == Status.COMPLETED
    for s in out:
        assert s.response_ids and len(s.response_ids) == len(s.response_logprobs) == len(s.response_model_steps)
        assert s.response_text == decode(s.response_ids)
        assert s.reward["score"] == float(s.response_ids[0] % 2 == 0)
        assert set(s.response_model_steps) == {0}
    assert all(a is b for a, b in zip(out, group))


def test_partial_rollout_continues_token_for_token_on_newer_weights():
    engine, loop, group = _setup(mean=40, cv=0.0, tpt=0.02, max_tokens=64)

    async def main():
        first = await _interrupt(loop, group, partial=True, after_s=0.05)
        assert first.status == Status.ABORTED
        assert all(s.status == Status.ABORTED and s.num_aborts == 1 for s in first)
        assert all(0 < len(s.response_ids) < 40 for s in first)
        snap = [(list(s.response_ids), list(s.response_logprobs), list(s.response_model_steps)) for s in first]
        await engine.load_weights({}, version=1)
        second = await loop.generate_group(first, enable_partial_rollout=True)
        return snap, second

    snap, second = run_on_virtual_clock(main())
    assert second.status == Status.COMPLETED
    for (ids, lps, steps), s in zip(snap, second):
        n = len(ids)
        assert s.response_ids[:n] == ids and s.response_logprobs[:n] == lps and s.response_model_steps[:n] == steps
        assert set(steps) == {0} and set(s.response_model_steps[n:]) == {1}
        # the continuation asked only for what the budget still allowed
        assert len(s.response_ids) <= 64 and len(s.response_ids) > n
        assert s.reward is not None


def test_continuation_keeps_members_that_already_finished():
    engine, loop, group = _setup(mean=20, cv=1.5, tpt=0.005, max_tokens=1000, k=8)

    async def main():
        first = await _interrupt(loop, group, partial=True, after_s=0.0, until=lambda st: st["in_flight"] < 8)
        done = {s.uid: (list(s.response_ids), s.finish_reason) for s in first if s.status == Status.COMPLETED}
        assert done and len(done) < 8, "expected some members finished and some interrupted"
        second = await loop.generate_group(first, enable_partial_rollout=True)
        return done, second

    done, second = run_on_virtual_clock(main())
    for s in second:
        if s.uid in done:
            assert (s.response_ids, s.finish_reason) == done[s.uid]
            assert s.num_aborts == 0
    assert second.status == Status.COMPLETED


def test_without_partial_rollout_an_interrupted_group_restarts_from_scratch():
    engine, loop, group = _setup(mean=40, cv=0.0, tpt=0.02)

    async def main():
        first = await _interrupt(loop, group, partial=False, after_s=0.05)
        assert all(s.status == Status.ABORTED and s.response_ids == [] for s in first)
        assert loop.tokens_discarded > 0
        await engine.load_weights({}, version=3)
        return await loop.generate_group(first, enable_partial_rollout=False)

    second = run_on_virtual_clock(main())
    assert second.status == Status.COMPLETED
    assert all(set(s.response_model_steps) == {3} for s in second)


def test_a_judger_that_raises_marks_the_group_failed():
    engine, loop, group = _setup(judger=Broken(), mean=3, tpt=1e-4)
    out = asyncio.run(loop.generate_group(group, enable_partial_rollout=False))
    assert all(s.status == Status.FAILED for s in out)
    assert "judge down" in out.drop_reason


def test_unknown_agent_name_is_refused():
    with pytest.raises(ValueError, match="agent.name='nope'"):
        build_agent_loop(AgentConf(name="nope"), None, FirstTokenParity(), decode)


class _CrashingMember(SingleTurnAgentLoop):
    """Per-member loop (as multi_turn_tool's): member 0 crashes, the others finish later."""

    async def _generate_member(self, s):
        if s.uid.endswith("-0"):
            await asyncio.sleep(0.01)
            raise RuntimeError("member 0 crashed")
        await asyncio.sleep(0.2)
        s.append_tokens([7, 8], [-0.1, -0.2], [0, 0])
        s.status, s.finish_reason = Status.COMPLETED, "stop"


def test_a_crashed_member_cancels_its_siblings_and_leaves_the_restored_group_alone():
    from rlharness.producer.pending import Started

    loop = _CrashingMember(SingleTurnAgentConf(), None, FirstTokenParity(), decode)
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[5, 6], label={}, k=3)

    async def main():
        started = Started(group)  # what the producer keeps to give the group back
        with pytest.raises(RuntimeError, match="member 0 crashed"):
            await loop.generate_group(group, enable_partial_rollout=False)
        restored = started.restore().mark_aborted()  # the producer's crash path
        await asyncio.sleep(0.4)  # longer than the siblings would have run
        return restored

    restored = run_on_virtual_clock(main())
    assert [s.status for s in restored] == [Status.ABORTED] * 3
    assert all(s.response_ids == [] and s.finish_reason is None for s in restored)
