"""Builds a real producer stack on the sim engine, plus the invariant checks the tests share."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlharness.agent import build_agent_loop
from rlharness.config.schema import (
    AsyncStrategyConf,
    SamplerConf,
    SamplingConf,
    SimEngineConf,
    SingleTurnAgentConf,
    SyncStrategyConf,
)
from rlharness.data.base import PromptRow
from rlharness.engine.sim import SimEngine
from rlharness.judger.base import Judger
from rlharness.producer.manager import AgentLoopManager, ProducedBatch
from rlharness.producer.staleness import StalenessPolicy
from rlharness.producer.strategies import ProduceStrategy, build_strategy
from rlharness.producer.replay_buffer import KEPT_STATUSES, ReplayBuffer
from rlharness.producer.sampler import Sampler
from rlharness.core.types import Group

TASK = "t"
VOCAB = 50


class ParityJudger(Judger):
    """Test judger: reward 1 when the first response token is even."""

    name = "parity"

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        first = response_text.split()[0] if response_text else "1"
        return {"score": float(int(first) % 2 == 0)}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        # On the loop, not in a thread: under a VirtualClock a thread's real time races the
        # virtual judge timeout (a loaded machine failed groups as timeouts).
        return self.score(response_text, label)


class RaisingJudger(ParityJudger):
    """Test judger that raises on every prompt whose index is a multiple of `every`."""

    name = "raising"

    def __init__(self, every: int = 3) -> None:
        self.every = every

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        if label["i"] % self.every == 0:
            raise ValueError(f"cannot judge prompt {label['i']}")
        return super().score(response_text, label)


def make_rows(n: int) -> list[PromptRow]:
    return [PromptRow(index=i, prompt_text=f"p{i}", label={"i": i}) for i in range(n)]


def encode(text: str) -> list[int]:
    return [ord(c) % VOCAB for c in text]


def decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def strategy_conf(name: str, *, max_staleness: int = 0, group_filter: str = "none", pause_timeout_s: float = 5.0,
                  staleness_mode: str = "token", **async_kw: Any):
    if name == "sync":
        if async_kw:
            raise TypeError(f"strategy_conf('sync') takes no async options: {sorted(async_kw)}")
        return SyncStrategyConf(max_staleness=max_staleness, group_filter=group_filter,
                                pause_timeout_s=pause_timeout_s, staleness_mode=staleness_mode)
    return AsyncStrategyConf(max_staleness=max_staleness, group_filter=group_filter,
                             pause_timeout_s=pause_timeout_s, staleness_mode=staleness_mode, **async_kw)


def staleness_of(strategy: SyncStrategyConf | AsyncStrategyConf) -> StalenessPolicy:
    """The staleness policy of a one-task run with this strategy (as build.py builds it)."""
    return StalenessPolicy(max_staleness=strategy.max_staleness, mode=strategy.staleness_mode)


def strategy_of(strategy: SyncStrategyConf | AsyncStrategyConf) -> ProduceStrategy:
    return build_strategy(strategy, staleness_of(strategy))


@dataclass
class Harness:
    mgr: AgentLoopManager
    engine: SimEngine
    rb: ReplayBuffer
    sampler: Sampler
    max_staleness: int
    staleness_mode: str = "token"
    trained: list[tuple[int, Group]] = field(default_factory=list)  # (train_step, group)
    dropped: list[Group] = field(default_factory=list)


def build(
    strategy: Any,
    *,
    n_rows: int = 64,
    k: int = 2,
    batch_size: int = 4,
    seed: int = 0,
    rollover: bool = True,
    judger: Judger | None = None,
    engine_conf: SimEngineConf | None = None,
    engine: SimEngine | None = None,
    max_tokens: int = 16,
    last_step: int = 0,
) -> Harness:
    max_staleness = strategy.max_staleness
    staleness = staleness_of(strategy)
    rb = ReplayBuffer(staleness)
    sampler = Sampler(SamplerConf(prompt_repeat_k=k, allow_epoch_rollover=rollover), TASK, make_rows(n_rows),
                      encode, rb, seed)
    if engine is None:
        engine = SimEngine(engine_conf or SimEngineConf(mean_response_len=8, cv=1.0, time_per_token_s=1e-4, slots=8),
                           seed=seed, vocab_size=VOCAB)
    loop = build_agent_loop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=max_tokens)), engine,
                            judger or ParityJudger(), decode)
    mgr = AgentLoopManager(tasks={TASK: (sampler, loop)}, strategy=build_strategy(strategy, staleness),
                           replay_buffer=rb, batch_size=batch_size, poll_interval_s=0.05, last_step=last_step)
    return Harness(mgr, engine, rb, sampler, max_staleness, strategy.staleness_mode)


def check_batch(h: Harness, batch: ProducedBatch, step: int) -> None:
    """The batch is complete and within the bound: every token's staleness (token mode), or every
    group's staleness at admission (admission mode: budgeted for a step at most max_staleness past
    its start version, and trained no earlier than that step's turn allows)."""
    assert len(batch.groups) == h.mgr.batch_size
    for g in batch.groups:
        admission = g.admission
        assert 0 <= admission.staleness
        if h.staleness_mode == "admission":
            assert admission.staleness <= h.max_staleness, (step, admission)
        for s in g:
            assert s.group_id == g.group_id and s.task == g.task == TASK
            assert s.status.value == "completed"
            assert s.response_ids and len(s.response_ids) == len(s.response_logprobs) == len(s.response_model_steps)
            staleness = step - 1 - min(s.response_model_steps)
            assert 0 <= staleness, (step, s.response_model_steps)
            if h.staleness_mode == "token":
                assert staleness <= h.max_staleness, (step, s.response_model_steps)
            assert min(s.response_model_steps) >= admission.version  # no token older than the admission
            assert s.response_model_steps == sorted(s.response_model_steps)  # continuations only append newer
    if h.staleness_mode == "token":
        assert batch.stats["staleness/max"] <= h.max_staleness
    else:
        assert batch.stats["staleness/admission_max"] <= h.max_staleness
    h.trained.extend((step, g) for g in batch.groups)
    h.dropped.extend(h.mgr.pop_dropped())


async def sync_weights(h: Harness, step: int) -> None:
    await h.engine.load_weights({}, step)
    h.mgr.set_model_step(step)


async def run_colocate(h: Harness, steps: int, first_step: int = 1) -> None:
    for step in range(first_step, first_step + steps):
        batch = await h.mgr.produce_batch(step)
        check_batch(h, batch, step)
        assert h.mgr.in_flight() == 0  # colocated: nothing runs into training
        check_accounting(h)
        await sync_weights(h, step)


async def run_disagg(h: Harness, steps: int, *, first_step: int = 1, train_s: float = 0.002,
                     on_pause=None) -> None:
    loop_task = asyncio.create_task(h.mgr.produce_loop())
    try:
        for step in range(first_step, first_step + steps):
            batch = await h.mgr.get_batch(step, timeout_s=30)
            check_batch(h, batch, step)
            await asyncio.sleep(train_s)  # training, concurrent with production
            await h.mgr.pause()
            assert h.mgr.in_flight() == 0
            check_accounting(h)
            if on_pause is not None:
                on_pause(h)
            await sync_weights(h, step)
            h.mgr.resume()
    finally:
        await h.mgr.close()
        await asyncio.wait_for(loop_task, timeout=10)
    check_accounting(h)


def buffered_groups(rb: ReplayBuffer) -> list[Group]:
    return [g for t in rb.tasks() for st in KEPT_STATUSES for g in rb.groups(t, st)]


def check_accounting(h: Harness) -> None:
    acc = h.mgr.accounting()
    assert acc["unaccounted"] == 0, acc


def check_nothing_lost(h: Harness, extra_trained: list[Group] = (), extra_dropped: list[Group] = ()) -> None:
    """Every prompt drawn is trained, dropped or buffered exactly once (nothing in flight)."""
    assert h.mgr.in_flight() == 0
    h.dropped.extend(h.mgr.pop_dropped())
    trained = [g for _, g in h.trained] + list(extra_trained)
    dropped = h.dropped + list(extra_dropped)
    everything = trained + dropped + buffered_groups(h.rb)
    keys = Counter((g.epoch, g.prompt_index) for g in everything)
    dup = {k: n for k, n in keys.items() if n > 1}
    assert not dup, f"prompts seen more than once within an epoch: {dup}"
    assert len({g.group_id for g in everything}) == len(everything)
    assert len(everything) == h.sampler.drawn, (len(everything), h.sampler.drawn)
    check_accounting(h)
