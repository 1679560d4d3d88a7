"""ProduceContext: everything a strategy needs to produce one task's groups.

It keeps the runtime contract in one place: targets and consumption are read live
from the shared ProduceProgress (absolute counts); the pause flag is the manager's;
every finished, crashed or cancelled task goes through `collect`, which filters,
stamps and puts the group into the replay buffer. Nothing taken from the sampler
leaves the pending set without landing in the buffer (or its dropped ledger).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.producer.filters import GroupFilter
from rlharness.producer.pending import Claimed, _PendingTasks
from rlharness.producer.progress import ProduceProgress
from rlharness.replay_buffer import ReplayBuffer, mark_aborted
from rlharness.sampler import Sampler
from rlharness.types import Group, Status, group_status

log = logging.getLogger(__name__)

# A group whose agent loop crashed this many times is FAILED (and ledgered) instead of retried forever.
MAX_CRASHES_PER_GROUP = 3


class Signal:
    """An asyncio.Event bound to whichever event loop is running when it is used.

    A trainer may drive the manager from several `asyncio.run` calls; a plain Event
    would stay bound to the first loop.
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._event, self._loop = asyncio.Event(), loop
        assert self._event is not None
        return self._event

    def set(self) -> None:
        try:
            self._get().set()
        except RuntimeError:  # no running loop: nobody can be waiting
            pass

    def clear(self) -> None:
        self._get().clear()

    def event(self) -> asyncio.Event:
        return self._get()

    async def wait(self, timeout_s: float) -> bool:
        """True if set within `timeout_s`."""
        try:
            await asyncio.wait_for(self._get().wait(), timeout=timeout_s)
            return True
        except asyncio.TimeoutError:
            return False


@dataclass
class ProduceContext:
    task: str
    sampler: Sampler
    agent_loop: AgentLoop
    replay_buffer: ReplayBuffer
    progress: ProduceProgress
    task_batch_size: int
    group_filter: GroupFilter
    model_step: Callable[[], int]  # the engines' current weight version, read live
    producer_wake: Signal  # set when a task finishes or a pause is requested
    on_put: Callable[[], None]  # tells waiting consumers the buffer changed
    # Per-batch window counters (groups_filtered, groups_failed, groups_aborted...), reset by the manager.
    window: Counter = field(default_factory=Counter)
    pending: _PendingTasks = field(default_factory=_PendingTasks)
    paused: bool = False
    # Generated groups filtered, failed or expired on arrival since the last one kept COMPLETED
    # (a run that cannot make progress stops with an error instead of spinning).
    dropped_in_a_row: int = 0
    # Tail-batch bookkeeping, for metrics and tests.
    tail_rounds: int = 0
    last_round_tail: bool = False

    # ------------------------------------------------------------------ progress
    def target(self) -> int:
        return self.progress.target_samples[self.task]

    def available(self) -> int:
        """Groups produced so far that count toward the target: consumed + waiting COMPLETED."""
        return self.progress.consumed_samples[self.task] + self.replay_buffer.count(self.task, Status.COMPLETED)

    def expired_count(self) -> int:
        return self.replay_buffer.count(self.task, Status.EXPIRED)

    def should_stop(self) -> bool:
        return self.paused

    # ------------------------------------------------------------------ generation
    def take_group(self, from_expired_only: bool = False) -> Group:
        return self.sampler.sample(from_expired_only=from_expired_only)

    def start(self, group: Group, enable_partial_rollout: bool) -> asyncio.Task:
        """Start generating `group` and track it (with its input) in the pending set."""
        return self.pending.spawn(group, self._generate_fn(enable_partial_rollout), self._task_done)

    def schedule_one(self, *, max_pending: int, enable_partial_rollout: bool, from_expired_only: bool) -> bool:
        return self.pending.schedule_one(
            max_pending=max_pending,
            should_stop=self.should_stop,
            take_group=lambda: self.take_group(from_expired_only),
            make_coro=self._generate_fn(enable_partial_rollout),
            on_done=self._task_done,
        )

    def _generate_fn(self, enable_partial_rollout: bool):
        async def generate(group: Group) -> Group:
            loop = asyncio.get_running_loop()
            start_s = loop.time()
            result = await self.agent_loop.generate_group(group, enable_partial_rollout=enable_partial_rollout)
            for s in result:
                s.extra["generate_s"] = loop.time() - start_s
            return result

        return generate

    def _task_done(self, _task: asyncio.Task) -> None:
        self.producer_wake.set()

    async def wait_and_collect(self, timeout_s: float) -> int:
        """Wait for some task to finish (or a wake-up) and put whatever finished; returns groups put."""
        done = await self.pending.wait_any(timeout_s, wake=self.producer_wake.event())
        return self.collect(self.pending.claim(done))

    # ------------------------------------------------------------------ results
    def collect(self, claimed: Claimed) -> int:
        for task, input_group in claimed:
            self._put(self._outcome(task, input_group))
        return len(claimed)

    def _outcome(self, task: asyncio.Task, input_group: Group) -> Group:
        if not task.done() or task.cancelled():
            self.window["groups_cancelled"] += 1
            return mark_aborted(input_group)
        exc = task.exception()
        if exc is not None:
            crashes = int(input_group[0].extra.get("num_crashes", 0)) + 1
            log.error("task %s: agent loop crashed on group %s (%d time(s)): %r",
                      self.task, input_group[0].group_id, crashes, exc, exc_info=exc)
            for s in input_group:
                s.extra["num_crashes"] = crashes
            if crashes >= MAX_CRASHES_PER_GROUP:
                for s in input_group:
                    s.status = Status.FAILED
                    s.extra["fail_reason"] = f"agent loop crashed {crashes} times, last: {exc!r}"
                return input_group
            return mark_aborted(input_group)
        return task.result()

    def _put(self, group: Group) -> None:
        status = group_status(group)
        if status == Status.COMPLETED:
            reason = self.group_filter(group)
            if reason is not None:
                for s in group:
                    s.status = Status.FILTERED
                    s.extra["filter_reason"] = reason
                status = Status.FILTERED
        self.window["groups_generated"] += 1
        self.window["tokens_generated"] += sum(len(s.response_ids) for s in group)
        if status == Status.FILTERED:
            self.window["groups_filtered"] += 1
        elif status == Status.FAILED:
            self.window["groups_failed"] += 1
        elif status == Status.ABORTED:
            self.window["groups_aborted"] += 1
        stored = self.replay_buffer.put(group, model_step=self.model_step(),
                                        train_step=self.progress.next_consumer_step)
        if stored == Status.COMPLETED:
            self.dropped_in_a_row = 0
        elif status in (Status.FILTERED, Status.FAILED, Status.COMPLETED):  # COMPLETED -> expired on arrival
            self.dropped_in_a_row += 1
        self.on_put()
