"""AgentLoopManager: runs the produce strategy over tasks and hands batches to the trainer.

Colocated (`produce_batch`): rollout and training take turns on the same devices, so
each call produces one batch into the buffer, aborts what is still in flight (back
to the buffer as ABORTED) and takes the batch.

Disaggregated (`produce_loop` + `get_batch`): the loop produces ahead of the consumer
while staying within the staleness bound; `get_batch` blocks until a full batch is
ready; `pause`/`resume` bracket a weight sync. The staleness bound is the run's
`StalenessPolicy` (producer/staleness.py), which comes with the replay buffer: in token
mode the buffer enforces it at take time (`refresh_staleness(train_step)`) and the loop
only avoids producing what would expire on arrival (`may_produce_for`); in admission
mode the strategy holds it where groups start (`ProduceContext.admission_room`) and
nothing expires. It never produces for steps past `last_step`.

End of data (`sampler.allow_epoch_rollover=false`): when a batch cannot be completed
because nothing is left to draw or retry and nothing is in flight, `produce_batch` and
`get_batch` raise `DataExhausted` (the trainer stops there with a checkpoint); the
drawn prompts stay in the buffer.

The manager receives its collaborators ready-built and a few scalars; it never reads
the run config. `state_dict`/`load_state_dict` are synchronous (callable from inside
a running event loop) and save in-flight groups as ABORTED, so resume loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlharness.agent.base import AgentLoop
from rlharness.config.schema import check_prompt_repeat_k
from rlharness.health.bias import GenerationTally
from rlharness.producer.context import ProduceContext, Signal
from rlharness.producer.metrics import StepMetrics
from rlharness.producer.progress import BatchAllocation, ProduceProgress
from rlharness.producer.strategies import ProduceStatus, ProduceStrategy
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.producer.sampler import DataExhausted, Sampler
from rlharness.core.types import Group, Status

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass
class ProducedBatch:
    groups: list[Group]
    train_step: int
    stats: dict[str, float] = field(default_factory=dict)
    # What was generated and dropped since the previous batch (the bias metrics, rlharness/health/bias.py).
    generated: GenerationTally = field(default_factory=GenerationTally)

    @property
    def num_samples(self) -> int:
        return sum(len(g) for g in self.groups)


def _check_parts(tasks: dict[str, tuple[Sampler, AgentLoop]], strategy: ProduceStrategy,
                 replay_buffer: ReplayBuffer) -> None:
    """Refuse parts that were not built for one run (build.py builds them together)."""
    if not tasks:
        raise ValueError("AgentLoopManager needs at least one task")
    differ = strategy.staleness.disagreements(replay_buffer.staleness, "the replay buffer's")
    if differ:
        raise ValueError(f"the strategy's staleness policy is not the replay buffer's: {'; '.join(differ)}")
    for name, (sampler, _) in tasks.items():
        if sampler.task != name:
            raise ValueError(f"tasks[{name!r}] holds a sampler for task {sampler.task!r}")
    unknown = sorted(set(replay_buffer.staleness.task_bounds) - set(tasks))
    if unknown:
        raise ValueError(f"the replay buffer has staleness bounds for tasks {unknown} this manager lacks")


class AgentLoopManager:
    def __init__(
        self,
        tasks: dict[str, tuple[Sampler, AgentLoop]],
        strategy: ProduceStrategy,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        poll_interval_s: float = 0.5,
        weights: dict[str, float] | None = None,
        over_sample_thresholds: dict[str, float] | None = None,
        last_step: int = 0,
        teachers: dict[str, Any] | None = None,
        failed_member_policy: str = "mask",
    ) -> None:
        """`weights` split every step's batch over the tasks (largest remainder carried across
        steps; None = equal); `over_sample_thresholds` replace the async strategy's per task;
        `teachers` (task name -> its distillation teacher) score those tasks' groups once judged.
        The staleness policy is the replay buffer's; the strategy must have been given the same."""
        _check_parts(tasks, strategy, replay_buffer)
        self.staleness = replay_buffer.staleness
        self.strategy = strategy
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        self.poll_interval_s = poll_interval_s
        self.failed_member_policy = failed_member_policy  # algo.failed_member_policy (core/member_failures.py)
        weights = dict(weights) if weights is not None else {name: 1.0 for name in tasks}
        if set(weights) != set(tasks):
            raise ValueError(f"weights are for tasks {sorted(weights)}, the manager has {sorted(tasks)}")
        self.allocation = BatchAllocation(batch_size, {name: weights[name] for name in tasks})
        # Tasks whose data may run out (no epoch roll-over) leave the mix instead of ending the run.
        self.may_leave = {name for name, (sampler, _) in tasks.items()
                          if len(tasks) > 1 and not sampler.conf.allow_epoch_rollover}
        for name, (sampler, _) in tasks.items():
            # A task that may leave the mix may have fewer prompts than one step's share: it
            # leaves at the first step it cannot fill.
            if name not in self.may_leave:
                sampler.check_batch_size(self.allocation.share(name))
            check_prompt_repeat_k(sampler.conf.prompt_repeat_k, group_filter=strategy.group_filter_name, task=name)

        self.progress = ProduceProgress.build(list(tasks))
        self.progress.last_step = last_step  # 0 = unbounded
        self._model_step = 0
        self._producer_wake = Signal()
        self._consumer_wake = Signal()
        self.contexts = self._contexts(tasks, over_sample_thresholds or {}, teachers or {})
        self._paused = False
        # Set by `hurry` when the run is stopping: drains wait at most this long, not pause_timeout_s.
        self._drain_limit_s: float | None = None
        self._closed = False
        self._loop_task: asyncio.Task | None = None
        self._loop_error: BaseException | None = None
        self._exhausted = False  # the produce loop's last round ran out of data with nothing in flight
        self._consumer_waiting_step = 0
        self._serving_step = 0  # the step produce_batch/get_batch is producing for right now
        self.metrics = StepMetrics(replay_buffer, self.contexts)

    def _contexts(self, tasks: dict[str, tuple[Sampler, AgentLoop]], over_sample_thresholds: dict[str, float],
                  teachers: dict[str, Any]) -> dict[str, ProduceContext]:
        """One produce context per task, sharing the progress, the wake-ups and the staleness policy."""
        strategy = self.strategy
        return {
            name: ProduceContext(
                task=name,
                sampler=sampler,
                agent_loop=loop,
                replay_buffer=self.replay_buffer,
                progress=self.progress,
                task_batch_size=self.allocation.share(name),
                over_sample_threshold=over_sample_thresholds.get(name),
                group_filter=strategy.group_filter,
                model_step=lambda: self._model_step,
                producer_wake=self._producer_wake,
                on_put=self._on_put,
                staleness=self.staleness,
                target_cap=self._target_cap(name),
                # One task: every step's batch is `batch_size` (task_batch_size), no per-step lookup.
                step_size=None if len(tasks) == 1 else (lambda step, name=name: self.allocation.sizes(step)[name]),
                abort_cap=strategy.abort_cap(),
                teacher=teachers.get(name),
                failed_member_policy=self.failed_member_policy,
            )
            for name, (sampler, loop) in tasks.items()
        }

    def _target_cap(self, task: str):
        """Token mode, a task tighter than the run (`StalenessPolicy.caps_target`): it produces only for
        the steps its groups would not expire for; the buffer's expiry holds the bound, this avoids
        producing what would expire on arrival. Admission mode needs none (its room is per task)."""
        if not self.staleness.caps_target(task):
            return None

        def cap() -> int:
            furthest = max(self.staleness.furthest_step(self._model_step, task), self._serving_step)
            return self.allocation.cumulative(furthest)[task]
        return cap

    def _on_put(self) -> None:
        """A group landed in the buffer: wake a waiting consumer once a batch can be taken
        (not on every group: one wake-up per group cost the consumer a loop turn each)."""
        if self._consumer_waiting_step and not self.replay_buffer.ready(self.allocation.sizes(self._consumer_waiting_step)):
            return
        self._consumer_wake.set()

    # ------------------------------------------------------------------ versions
    @property
    def model_step(self) -> int:
        return self._model_step

    def set_model_step(self, version: int) -> None:
        """The engines now hold weight version `version` (after train step t: version t)."""
        self._model_step = version
        self._producer_wake.set()

    # ------------------------------------------------------------------ colocated
    async def produce_batch(self, train_step: int) -> ProducedBatch:
        if self._loop_task is not None and not self._loop_task.done():
            raise RuntimeError("produce_batch is for colocated mode, but produce_loop is running; use get_batch")
        if not self.staleness.may_produce_for(train_step, self._model_step):
            raise ValueError(
                f"produce_batch(train_step={train_step}): engine weights are version {self._model_step}, so "
                f"every sample would be {train_step - 1 - self._model_step} versions stale (expires at "
                f"{self.staleness.threshold()}); "
                f"call set_model_step(version) after each weight sync"
            )
        if self._closed or self._paused:
            raise RuntimeError(f"produce_batch(train_step={train_step}) on a manager that is "
                               f"{'closed' if self._closed else 'paused'}")
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        self.progress.begin_consume(train_step)
        self.replay_buffer.refresh_staleness(train_step)
        self._serving_step = train_step
        while True:
            # Again on every round: a task that left the mix changes this step's split.
            self.progress.set_local_target(train_step, self.allocation.sizes(train_step))
            try:
                statuses = await self._produce_all()
            finally:
                # Rollout and training share the devices: nothing may keep running into training.
                await self._drain_all()
            self.replay_buffer.refresh_staleness(train_step)
            if self.replay_buffer.ready(self.allocation.sizes(train_step)):
                return self._take(train_step, loop.time() - start_s)
            if ProduceStatus.EXHAUSTED in statuses and not self._retry_waiting():
                raise DataExhausted(self._exhausted_message(train_step))
            if ProduceStatus.PAUSED in statuses:
                raise RuntimeError(f"produce_batch(train_step={train_step}) was paused or closed mid-way")
            log.info("train step %d: groups expired or a task left the mix; producing the gap", train_step)

    async def _produce_all(self) -> list[ProduceStatus]:
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        contexts = list(self.contexts.values())
        try:
            results = await asyncio.gather(*(self.strategy.produce(c) for c in contexts), return_exceptions=True)
        finally:
            self.metrics.produce_s += loop.time() - start_s
        statuses = []
        for c, r in zip(contexts, results):
            if r is ProduceStatus.EXHAUSTED and c.task in self.may_leave and self._leave(c.task):
                continue  # the task left the mix; the others go on
            if isinstance(r, BaseException):
                raise r
            statuses.append(r)
        return statuses

    def _leave(self, task: str) -> bool:
        """`task`'s data ran out (no roll-over): from the first step it cannot fill, it leaves the
        mix and the other tasks share its weight. False if it is the last task (the run ends)."""
        if task in self.allocation.left or len(self.allocation.tasks) - len(self.allocation.left) <= 1:
            return False
        # Everything it will ever deliver is consumed or waiting (nothing in flight, pools empty).
        supply = self.progress.consumed_samples[task] + self.replay_buffer.count(task, Status.COMPLETED)
        step = self.progress.next_consumer_step
        while self.allocation.cumulative(step)[task] <= supply:
            step += 1
        old = {s: self.allocation.sizes(s) for s in range(step, self.progress.target_upto_future_step + 1)}
        self.allocation.leave(task, step)
        self.progress.follow_split(step, old.__getitem__, self.allocation.sizes)
        log.warning("task %s: data exhausted (no epoch roll-over); it leaves the mix from train step %d, "
                    "the other tasks share its weight: step %d is split %s", task, step, step,
                    self.allocation.sizes(step))
        return True

    def hurry(self, drain_timeout_s: float) -> None:
        """The run is stopping (SIGTERM): from now on a drain waits at most `drain_timeout_s` for in-flight
        groups (an engine's abort returns in well under a second; a judgement may take its whole timeout)
        before cancelling them back into the buffer, so the stop's checkpoint fits in stop_timeout_s."""
        self._drain_limit_s = drain_timeout_s

    async def _drain_all(self) -> None:
        for c in self.contexts.values():
            c.paused = True
        timeout_s = self.strategy.pause_timeout_s
        if self._drain_limit_s is not None:
            timeout_s = min(timeout_s, self._drain_limit_s)
        try:
            await asyncio.gather(*(self.strategy.drain(c, timeout_s) for c in self.contexts.values()))
        finally:
            for c in self.contexts.values():
                c.paused = self._paused or self._closed

    # ------------------------------------------------------------------ disaggregated
    async def produce_loop(self) -> None:
        """Produce ahead of the consumer until `close()`; pauses while `pause()` holds."""
        if self._loop_task is not None and not self._loop_task.done():
            raise RuntimeError("produce_loop is already running")
        self._loop_task = asyncio.current_task()
        self._loop_error = None
        try:
            while not self._closed:
                self._producer_wake.clear()
                if self._paused:
                    await self._producer_wake.wait(self.poll_interval_s)
                    continue
                # Target every step the staleness bound allows now, not one step at a time:
                # otherwise the in-flight budget is one batch, and while the last groups of
                # that batch finish (the long tail) the engines idle (producer benchmark).
                self._advance_targets()
                statuses = await self._produce_all()
                if self._closed or ProduceStatus.PAUSED in statuses:
                    continue
                self._exhausted = ProduceStatus.EXHAUSTED in statuses
                if self._exhausted:  # nothing to do until a group comes back (expiry) or the run ends
                    self._consumer_wake.set()
                    await self._producer_wake.wait(self.poll_interval_s)
                    continue
                if self._may_produce_for(self.progress.target_upto_future_step + 1):
                    continue  # the weights moved on while producing: raise the targets again
                await self._producer_wake.wait(self.poll_interval_s)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("produce_loop failed")
            self._loop_error = exc
            self._consumer_wake.set()
            raise

    def _advance_targets(self) -> None:
        """Raise the cumulative targets to the furthest step `_may_produce_for` allows."""
        nxt = self.progress.target_upto_future_step + 1
        while self._may_produce_for(nxt):
            self.progress.producer_future_step = nxt
            self.progress.ensure_target_upto(nxt, self.allocation)
            nxt += 1

    def _may_produce_for(self, future_step: int) -> bool:
        """Producing for `future_step` now is worthwhile if it would not expire on arrival.

        A consumer already waiting for that step is always served (the buffer still
        enforces the bound), so a trainer that never calls set_model_step cannot deadlock.
        """
        if 0 < self.progress.last_step < future_step:
            return False
        if future_step <= self._consumer_waiting_step:
            return True
        return self.staleness.may_produce_for(future_step, self._model_step)

    async def get_batch(self, train_step: int, timeout_s: float) -> ProducedBatch:
        """Block until a full batch for `train_step` is ready; TimeoutError after `timeout_s`."""
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        deadline = start_s + timeout_s
        self.progress.begin_consume(train_step)
        if self.progress.target_upto_future_step < train_step - 1:
            # The consumer starts ahead of the producer's targets (e.g. fresh producer state):
            # re-base so the producer owes exactly the batches from `train_step` on.
            for task in self.allocation.tasks:
                self.progress.target_samples[task] = max(self.progress.target_samples[task],
                                                         self.progress.consumed_samples[task])
            self.progress.target_upto_future_step = train_step - 1
        self._consumer_waiting_step = self._serving_step = train_step
        self._producer_wake.set()
        try:
            while True:
                self._consumer_wake.clear()
                if self.replay_buffer.refresh_staleness(train_step):
                    self._exhausted = False  # expired groups are work to redo
                    self._producer_wake.set()  # expired groups leave a gap to refill
                # A ready batch first: a producer that failed (or ran out) after it was complete
                # must not cost the step.
                if self.replay_buffer.ready(self.allocation.sizes(train_step)):
                    return self._take(train_step, loop.time() - start_s)
                if self._loop_error is not None:
                    raise RuntimeError(f"produce_loop failed: {self._loop_error!r}") from self._loop_error
                if self._exhausted and not self.in_flight() and not self._retry_waiting():
                    raise DataExhausted(self._exhausted_message(train_step))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(self._timeout_message(train_step, timeout_s))
                await self._consumer_wake.wait(min(remaining, self.poll_interval_s))
        finally:
            self._consumer_waiting_step = self._serving_step = 0

    def _retry_waiting(self) -> bool:
        """Some ABORTED or EXPIRED group waits in the buffer to be produced again."""
        return any(self.replay_buffer.count(t, st) for t in self.allocation.tasks
                   for st in (Status.ABORTED, Status.EXPIRED))

    def _exhausted_message(self, train_step: int) -> str:
        have = {t: self.replay_buffer.count(t, Status.COMPLETED) for t in self.allocation.tasks}
        return (f"train step {train_step}: the data ran out (sampler.allow_epoch_rollover=False) with {have} of "
                f"{self.allocation.sizes(train_step)} groups ready and nothing left to draw or retry")

    def _timeout_message(self, train_step: int, timeout_s: float) -> str:
        running = self._loop_task is not None and not self._loop_task.done()
        return (
            f"get_batch(train_step={train_step}) waited timeout_s={timeout_s:g} without a full batch: "
            f"COMPLETED groups {({t: self.replay_buffer.count(t, Status.COMPLETED) for t in self.allocation.tasks})}, "
            f"need {self.allocation.sizes(train_step)}; in flight {self.in_flight()}; paused={self._paused}; "
            f"produce_loop running={running}; engine version={self._model_step}"
        )

    async def pause(self) -> None:
        """Stop producing and return every in-flight group to the buffer (ABORTED).

        Waits at most the strategy's pause_timeout_s for aborted requests to come back,
        then cancels the rest; their input groups still go back to the buffer.
        """
        self._paused = True
        self._exhausted = False  # what the drain returns to the buffer is work to resume
        for c in self.contexts.values():
            c.paused = True
        self._producer_wake.set()
        await self._drain_all()

    def resume(self) -> None:
        self._paused = False
        for c in self.contexts.values():
            c.paused = False
        self._producer_wake.set()

    def agent_loops(self) -> list:
        return [c.agent_loop for c in self.contexts.values()]

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop the produce loop and return everything in flight to the buffer."""
        self._closed = True
        for c in self.contexts.values():
            c.paused = True
        self._producer_wake.set()
        task = self._loop_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            if not done:
                log.warning("produce_loop did not stop within %.1fs; cancelling it", timeout_s)
                task.cancel()
                await asyncio.wait({task}, timeout=timeout_s)
        await self._drain_all()
        self._loop_task = None

    # ------------------------------------------------------------------ taking a batch
    def _take(self, train_step: int, produce_s: float) -> ProducedBatch:
        groups = self.replay_buffer.take_batch(self.allocation.sizes(train_step))
        counts = Counter(g.task for g in groups)
        self.progress.mark_consumed(dict(counts))
        self.progress.finish_consume(train_step)
        self._producer_wake.set()  # consumption opens room for the next step
        stats = self.metrics.step_stats(groups, train_step, produce_s)
        return ProducedBatch(groups=groups, train_step=train_step, stats=stats,
                             generated=self.metrics.take_generated())

    # ------------------------------------------------------------------ ledger and accounting
    def pop_dropped(self) -> list[Group]:
        """Filtered and failed groups (each with its `drop_reason`), for `rollouts/dropped.jsonl`."""
        return self.replay_buffer.pop_dropped()

    def in_flight(self) -> int:
        return sum(c.pending.count() for c in self.contexts.values())

    def accounting(self) -> dict[str, Any]:
        """Where every group drawn from the data is: trained, dropped, in the buffer or in flight."""
        c = self.replay_buffer.counters
        drawn = sum(ctx.sampler.drawn for ctx in self.contexts.values())
        trained = sum(self.progress.consumed_samples.values())
        dropped = c["dropped_filtered"] + c["dropped_failed"]
        in_buffer = self.replay_buffer.counts()
        in_flight = self.in_flight()
        return {
            "drawn": drawn,
            "trained": trained,
            "dropped": dropped,
            "in_buffer": in_buffer,
            "in_flight": in_flight,
            "unaccounted": drawn - trained - dropped - sum(in_buffer.values()) - in_flight,
        }

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Plain dicts/lists; groups in flight are saved as ABORTED (synchronous, no event loop needed)."""
        in_flight = [g for c in self.contexts.values() for g in c.pending.input_groups()]
        return {
            "version": STATE_VERSION,
            "tasks": list(self.contexts),
            "allocation": self.allocation.state_dict(),
            "model_step": self._model_step,
            "samplers": {name: c.sampler.state_dict() for name, c in self.contexts.items()},
            "replay_buffer": self.replay_buffer.state_dict(in_flight=in_flight),
            "progress": self.progress.state_dict(),
        }

    def _load_allocation(self, saved: dict[str, Any]) -> None:
        """The saved split; weights changed since apply from the resumed step (the steps trained keep
        theirs), and the targets the producer already set for later steps follow them."""
        step = self.progress.next_consumer_step
        before = BatchAllocation(self.batch_size, dict(saved["weights"]))
        before.load_state_dict(saved)
        if not self.allocation.load_state_dict(saved, from_step=step):
            return
        self.progress.follow_split(step, before.sizes, self.allocation.sizes)
        log.warning("the checkpoint's task weights were %s; this run's %s apply from train step %d on "
                    "(steps before keep their split): step %d is split %s", before.weights,
                    self.allocation.weights, step, step, self.allocation.sizes(step))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["version"] != STATE_VERSION:
            raise ValueError(f"producer state version {state['version']} != {STATE_VERSION}")
        if self.in_flight():
            raise RuntimeError(f"load_state_dict with {self.in_flight()} group(s) in flight; load before producing")
        saved = list(state.get("tasks", state["samplers"]))
        if set(saved) != set(self.contexts):
            missing, unknown = sorted(set(saved) - set(self.contexts)), sorted(set(self.contexts) - set(saved))
            raise ValueError(
                f"the checkpoint was saved with tasks {sorted(saved)}, this run has {sorted(self.contexts)}"
                + (f"; missing here: {', '.join(missing)}" if missing else "")
                + (f"; not in the checkpoint: {', '.join(unknown)}" if unknown else "")
                + ": resume with the same tasks (or start a new run)")
        self.progress.load_state_dict(state["progress"])
        if "allocation" in state:
            self._load_allocation(state["allocation"])
        for name, c in self.contexts.items():
            c.sampler.load_state_dict(state["samplers"][name])
            c.window.clear()
        self.replay_buffer.load_state_dict(state["replay_buffer"])
        self._model_step = state["model_step"]
        self.metrics.restart_window()
