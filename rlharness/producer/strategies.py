"""Produce strategies: how many groups to keep in flight, and how to stop.

`produce(ctx)` runs until the task's cumulative target is met (available = consumed
+ waiting COMPLETED >= target) or a pause is requested. `drain(ctx, timeout_s)`
returns every in-flight group to the buffer: it aborts the agent loop (ABORTED with
partial tokens), waits at most `timeout_s`, then cancels what is left and puts the
input groups of the cancelled tasks back as ABORTED. Nothing is ever lost.

- Sync: launches exactly the missing groups and refills gaps left by filtered or
  failed groups; nothing runs past the target.
- Async: keeps up to `target + ceil(over_sample_threshold * batch)` groups produced
  or in flight; tasks keep running between calls (and across steps in disaggregated
  mode). Partial rollout continues interrupted samples. Tail-batch mode (once
  `tail_batch_trigger_size` EXPIRED groups wait) stops over-sampling and refills from
  the EXPIRED pool first.

In admission mode (the run's `StalenessPolicy`) both keep what is produced or in flight
within the admission room (`ProduceContext.admission_room`): no group starts for a step
past the bound of the engines' weights, and the buffer never expires a started one.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
from enum import Enum

from rlharness.config import registry
from rlharness.config.schema import AsyncStrategyConf, StrategyConf, SyncStrategyConf
from rlharness.producer.context import ProduceContext, stall_message
from rlharness.producer.filters import build_group_filter
from rlharness.producer.staleness import StalenessPolicy
from rlharness.producer.sampler import DataExhausted

log = logging.getLogger(__name__)

# Safety net for waits that are normally ended by a task finishing or a wake-up.
_POLL_S = 0.5
# While draining, re-send the abort this often: a request may reach the engine after the first abort.
_ABORT_RETRY_S = 0.2
# Give up when this many groups in a row were filtered/failed (e.g. every reward equal):
# max(MIN, PER_GROUP * task batch size).
MIN_DROPPED_IN_A_ROW = 256
DROPPED_IN_A_ROW_PER_GROUP = 20


class ProductionStalled(RuntimeError):
    """Every recent group was dropped; the message names the cause (judging, filter, expiry, crashes)."""


class ProduceStatus(Enum):
    DONE = "done"  # the cumulative target is met
    PAUSED = "paused"  # a pause was requested; in-flight work is left to `drain`
    EXHAUSTED = "exhausted"  # short of the target, nothing in flight, and the data ran out


class ProduceStrategy(abc.ABC):
    name: str = "base"
    enable_partial_rollout: bool = False

    def __init__(self, conf: StrategyConf, staleness: StalenessPolicy) -> None:
        self.staleness = staleness  # the run's policy; the conf's staleness keys fed it (build.py)
        self.pause_timeout_s = conf.pause_timeout_s
        self.group_filter_name = conf.group_filter
        self.group_filter = build_group_filter(conf.group_filter)
        self.max_aborts = conf.max_aborts

    def abort_cap(self) -> int:
        """Interruptions after which a group is FAILED (0 = never): only when it restarts from scratch."""
        return 0 if self.enable_partial_rollout else self.max_aborts

    @abc.abstractmethod
    async def produce(self, ctx: ProduceContext) -> ProduceStatus: ...

    def in_flight_budget(self, ctx: ProduceContext) -> int:
        """The most groups this strategy keeps produced-or-in-flight beyond consumption (for checks)."""
        return ctx.target() - ctx.progress.consumed_samples[ctx.task]

    def _fill(self, ctx: ProduceContext, max_pending: int, from_expired_only: bool) -> None:
        """Start groups until `max_pending` are in flight; stop quietly when the data run out
        (`ctx.data_exhausted`: the sampler had nothing left, not even a group to retry)."""
        limit = max(MIN_DROPPED_IN_A_ROW, DROPPED_IN_A_ROW_PER_GROUP * ctx.task_batch_size)
        if ctx.dropped_in_a_row >= limit:
            raise ProductionStalled(stall_message(ctx, self.group_filter_name))
        if self.staleness.admission:  # the bound held where groups start (pending also counts continuations)
            max_pending = min(max_pending, ctx.admission_room())
        ctx.data_exhausted = False
        try:
            while ctx.schedule_one(
                max_pending=max_pending,
                enable_partial_rollout=self.enable_partial_rollout,
                from_expired_only=from_expired_only and ctx.expired_count() > 0,
            ):
                pass
        except DataExhausted:
            ctx.data_exhausted = True
            if ctx.pending.count():
                log.info("task %s: data exhausted; finishing the %d group(s) in flight", ctx.task, ctx.pending.count())

    @staticmethod
    def _exhausted(ctx: ProduceContext) -> bool:
        """Short of the target with nothing in flight and nothing left to draw: the caller decides."""
        return ctx.data_exhausted and ctx.pending.count() == 0

    async def drain(self, ctx: ProduceContext, timeout_s: float) -> None:
        if ctx.pending.count() == 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        next_abort = loop.time()
        while ctx.pending.count() and loop.time() < deadline:
            if loop.time() >= next_abort:
                await self._abort(ctx, deadline - loop.time())
                next_abort = loop.time() + _ABORT_RETRY_S
            ctx.collect(ctx.pending.claim_done())
            if not ctx.pending.count():
                break
            wait_s = max(0.0, min(deadline, next_abort) - loop.time())
            done = await ctx.pending.wait_any(wait_s)
            ctx.collect(ctx.pending.claim(done))
        if ctx.pending.count():
            log.warning("task %s: %d group(s) still in flight after pause_timeout_s=%.1f; cancelling them",
                        ctx.task, ctx.pending.count(), timeout_s)
            ctx.collect(await ctx.pending.cancel_all())

    @staticmethod
    async def _abort(ctx: ProduceContext, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(ctx.agent_loop.pause(), timeout=max(timeout_s, 1e-3))
        except asyncio.TimeoutError:
            log.warning("task %s: agent loop pause (engine abort) timed out", ctx.task)
        except Exception:  # noqa: BLE001 - a failing abort must not stop the drain
            log.exception("task %s: agent loop pause (engine abort) failed", ctx.task)


class SyncProduceStrategy(ProduceStrategy):
    name = "sync"

    def __init__(self, conf: SyncStrategyConf, staleness: StalenessPolicy) -> None:
        super().__init__(conf, staleness)

    async def produce(self, ctx: ProduceContext) -> ProduceStatus:
        while True:
            ctx.producer_wake.clear()
            if ctx.should_stop():
                return ProduceStatus.PAUSED
            ctx.collect(ctx.pending.claim_done())
            gap = ctx.target() - ctx.available()
            if gap <= 0:
                return ProduceStatus.DONE
            self._fill(ctx, max_pending=gap, from_expired_only=False)
            if self._exhausted(ctx):
                return ProduceStatus.EXHAUSTED
            await ctx.wait_and_collect(_POLL_S)


class AsyncProduceStrategy(ProduceStrategy):
    name = "async"

    def __init__(self, conf: AsyncStrategyConf, staleness: StalenessPolicy) -> None:
        super().__init__(conf, staleness)
        self.over_sample_threshold = conf.over_sample_threshold
        self.enable_partial_rollout = conf.enable_partial_rollout
        self.tail_batch_trigger_size = conf.tail_batch_trigger_size
        if not conf.enable_partial_rollout and staleness.max_staleness > 0:
            log.warning(
                "strategy.enable_partial_rollout=false with max_staleness=%d: groups interrupted by a weight sync "
                "restart from scratch, so long responses may be retried again and again (failed after "
                "strategy.max_aborts=%d interruptions); partial rollout keeps their tokens",
                staleness.max_staleness, conf.max_aborts)

    def oversample(self, ctx: ProduceContext) -> int:
        threshold = self.over_sample_threshold if ctx.over_sample_threshold is None else ctx.over_sample_threshold
        return math.ceil(threshold * ctx.task_batch_size)

    def in_flight_budget(self, ctx: ProduceContext) -> int:
        return super().in_flight_budget(ctx) + self.oversample(ctx)

    def tail_mode(self, ctx: ProduceContext) -> bool:
        return self.tail_batch_trigger_size > 0 and ctx.expired_count() >= self.tail_batch_trigger_size

    async def produce(self, ctx: ProduceContext) -> ProduceStatus:
        tail = self.tail_mode(ctx)
        ctx.last_round_tail = tail
        if tail:
            ctx.tail_rounds += 1
            log.info("task %s: %d EXPIRED groups >= tail_batch_trigger_size=%d: tail-batch round",
                     ctx.task, ctx.expired_count(), self.tail_batch_trigger_size)
        # Fixed for this round: tail mode refills only what is missing, from EXPIRED first; once the
        # targets reach the run's last step there is nothing left to over-sample for.
        oversample = 0 if tail or ctx.progress.at_last_step() else self.oversample(ctx)
        while True:
            ctx.producer_wake.clear()
            if ctx.should_stop():
                return ProduceStatus.PAUSED
            ctx.collect(ctx.pending.claim_done())
            available = ctx.available()
            if available >= ctx.target():
                return ProduceStatus.DONE
            self._fill(ctx, max_pending=ctx.target() + oversample - available, from_expired_only=tail)
            if self._exhausted(ctx):
                return ProduceStatus.EXHAUSTED
            await ctx.wait_and_collect(_POLL_S)


def build_strategy(conf: StrategyConf, staleness: StalenessPolicy) -> ProduceStrategy:
    """The strategy `conf.name` names (rlharness/config/registry.py)."""
    return registry.build("strategy", conf, staleness)
