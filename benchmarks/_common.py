"""Shared pieces of the producer benchmarks: the real producer stack, built small.

Everything here is the project's own code (Sampler, ReplayBuffer, SingleTurnAgentLoop,
AgentLoopManager, the produce strategies, SimEngine behind an EngineRouter), with one
benchmark-only adjustment, documented where it is defined:

- `PureAsyncJudger`: scores inline on the event loop. The library's `Judger.judge_group`
  runs the rule in `asyncio.to_thread` under a `wait_for` timeout; on a virtual clock the
  loop jumps to its next timer while the worker thread runs, so the judge timeout can
  fire in simulated time and the schedule depends on thread timing (not deterministic).

The engines are stock `SimEngine`s: requests carry the sample's seed, so a continued
(partial-rollout) response ends at the length drawn for it on whichever engine it lands,
and `SimEngine.busy_slot_s` gives the share of slots generating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlharness.agent.single_turn import SingleTurnAgentLoop
from rlharness.config.schema import (
    AsyncStrategyConf,
    SamplerConf,
    SamplingConf,
    SimEngineConf,
    SingleTurnAgentConf,
    StrategyConf,
)
from rlharness.data.base import PromptRow
from rlharness.engine.router import EngineRouter
from rlharness.engine.sim import SimEngine, lognormal_params
from rlharness.judger.base import Judger
from rlharness.producer.manager import AgentLoopManager
from rlharness.producer.staleness import StalenessPolicy
from rlharness.producer.strategies import build_strategy
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.producer.sampler import Sampler
from rlharness.core.types import Group

TASK = "bench"
VOCAB = 64
PROMPT_LEN = 16


class PureAsyncJudger(Judger):
    """Reward = parity of the response length; judged inline (no worker thread, no real time)."""

    name = "bench_parity"

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return {"score": float(int(response_text or "0") % 2 == 0)}

    async def judge_group(self, group: Group, timeout_s: float) -> Group:
        for s in group:
            s.reward = self.score(s.response_text, s.label)
        return group


def decode_len(ids: list[int]) -> str:
    """The benchmark's 'text' is the response length: cheap, and all the judger needs."""
    return str(len(ids))


# ----------------------------------------------------------------------------- lengths
def length_pmf(mean: float, cv: float, cap: int) -> list[float]:
    """P(n) for n = 0..cap of n = min(max(1, round(L)), cap), L ~ lognormal(mean, cv): the SimEngine's
    length law, exactly (lognormal CDF differences, no sampling noise). Index 0 is always 0."""
    pmf = [0.0] * (cap + 1)
    if cv == 0:
        pmf[min(max(1, round(mean)), cap)] = 1.0
        return pmf
    mu, sigma = lognormal_params(mean, cv)

    def cdf(x: float) -> float:
        return 0.0 if x <= 0 else 0.5 * (1.0 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2.0))))

    prev = 0.0  # P(L < n - 0.5); n = 1 also takes everything below 0.5
    for n in range(1, cap):
        upto = cdf(n + 0.5)
        pmf[n] = upto - prev
        prev = upto
    pmf[cap] = 1.0 - prev
    return pmf


def capped_length_mean(mean: float, cv: float, cap: int) -> float:
    """E[min(max(1, round(L)), cap)] for L ~ lognormal(mean, cv) (see `length_pmf`)."""
    return sum(n * p for n, p in enumerate(length_pmf(mean, cv, cap)))


# ----------------------------------------------------------------------------- the stack
@dataclass
class Stack:
    manager: AgentLoopManager
    engines: list[SimEngine]
    router: EngineRouter
    replay_buffer: ReplayBuffer
    sampler: Sampler


def make_rows(n: int) -> list[PromptRow]:
    return [PromptRow(index=i, prompt_text=str(i), label={}) for i in range(n)]


def encode_prompt(text: str) -> list[int]:
    """A fixed-length prompt whose ids spell the row index."""
    digits = [int(c) for c in text]
    return [VOCAB - 1] * (PROMPT_LEN - len(digits)) + digits


def build_stack(
    strategy: StrategyConf,
    *,
    engine_conf: SimEngineConf,
    num_engines: int,
    batch_size: int,
    group_size: int,
    max_tokens: int,
    seed: int = 0,
    num_rows: int = 100_000,
    poll_interval_s: float = 0.5,
) -> Stack:
    """The project's producer (sampler, replay buffer, agent loop, manager, strategy) on sim engines."""
    staleness = StalenessPolicy(max_staleness=strategy.max_staleness, mode=strategy.staleness_mode)
    rb = ReplayBuffer(staleness)
    sampler = Sampler(SamplerConf(prompt_repeat_k=group_size), TASK, make_rows(num_rows), encode_prompt, rb, seed)
    engines = [SimEngine(engine_conf, seed=seed * 1000 + i, vocab_size=VOCAB) for i in range(num_engines)]
    router = EngineRouter(engines)
    agent = SingleTurnAgentLoop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=max_tokens)), router,
                                PureAsyncJudger(), decode_len)
    manager = AgentLoopManager(tasks={TASK: (sampler, agent)}, strategy=build_strategy(strategy, staleness),
                               replay_buffer=rb, batch_size=batch_size, poll_interval_s=poll_interval_s)
    return Stack(manager, engines, router, rb, sampler)


def async_conf(max_staleness: int, *, partial: bool, over_sample: float = 0.0,
               staleness_mode: str = "token") -> AsyncStrategyConf:
    return AsyncStrategyConf(max_staleness=max_staleness, enable_partial_rollout=partial,
                             over_sample_threshold=over_sample, staleness_mode=staleness_mode)
