"""ProduceContext: everything a strategy needs to produce one task's groups.

It keeps the runtime contract in one place: targets and consumption are read live
from the shared ProduceProgress (absolute counts); the pause flag is the manager's;
every finished, crashed or cancelled task goes through `collect`, which filters,
stamps and puts the group into the replay buffer. Nothing taken from the sampler
leaves the pending set without landing in the buffer (or its dropped ledger).

Admission: every group that starts without tokens (fresh, expired, or restarted) is
stamped (the run's `StalenessPolicy.stamp`) with the engines' weight version and the
step its place in the cumulative counts budgets it for; a continuation keeps its stamp.
In admission mode `admission_room` (the policy's, on this task's counts) keeps the
staleness at admission within the task's bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from rlharness.core import fault_points
from rlharness.core.member_failures import INFRA_PREFIX, has_infra_failures, settle
from rlharness.agent.base import AgentLoop
from rlharness.health.bias import GenerationTally
from rlharness.producer.filters import GroupFilter
from rlharness.producer.pending import Claimed, Started, _PendingTasks
from rlharness.producer.progress import ProduceProgress
from rlharness.producer.staleness import StalenessPolicy
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.producer.sampler import Sampler
from rlharness.core.types import Group, Status

log = logging.getLogger(__name__)

# A group whose agent loop crashed this many times is FAILED (and ledgered) instead of retried forever.
MAX_CRASHES_PER_GROUP = 3


class Signal:
    """A flag that wakes waiters when set; waiters may belong to any event loop.

    A trainer may drive the manager from several `asyncio.run` calls, so nothing here is
    bound to one loop: a waiter is a future of its own loop, resolved there. The producer
    waits on it together with its pending set through `add_waiter` (a future resolved
    directly, not a task per wait: one wake-up per finished group, overhead benchmark).
    """

    def __init__(self) -> None:
        self._flag = False
        self._waiters: list[asyncio.Future] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for fut in waiters:
            if fut.done():
                continue
            loop = fut.get_loop()
            if loop is running:
                fut.set_result(True)
            else:  # a waiter in another thread's loop (or a closed one: nobody is waiting any more)
                try:
                    loop.call_soon_threadsafe(_resolve, fut, True)
                except RuntimeError:
                    pass

    def clear(self) -> None:
        self._flag = False

    def add_waiter(self, fut: asyncio.Future) -> None:
        """Resolve `fut` (result True) on the next `set`, or now if the flag is up."""
        if self._flag:
            _resolve(fut, True)
        else:
            self._waiters.append(fut)

    def remove_waiter(self, fut: asyncio.Future) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass

    async def wait(self, timeout_s: float) -> bool:
        """True if set within `timeout_s`."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        self._waiters.append(fut)
        try:
            return bool(await fut)
        finally:
            timer.cancel()
            self.remove_waiter(fut)


def _resolve(fut: asyncio.Future, value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


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
    staleness: StalenessPolicy  # the run's (shared with the buffer, strategy and manager)
    # This task's async over-sampling (None = the strategy's over_sample_threshold).
    over_sample_threshold: float | None = None
    # Token mode, a task bound tighter than the run's: the most groups worth producing now (its
    # cumulative allocation up to the furthest step they would not expire for); None: no cap.
    target_cap: Callable[[], int] | None = None
    # This task's groups in the batch of a step (the manager's BatchAllocation); None: task_batch_size.
    step_size: Callable[[int], int] | None = None
    # Per-batch window counters (groups_filtered, groups_failed, groups_aborted...), reset by the manager.
    window: Counter = field(default_factory=Counter)
    # Lengths and rewards of what finished generating, and of what was filtered, since the last batch
    # (the bias metrics, rlharness/health/bias.py); taken by the manager with the window.
    tally: GenerationTally = field(default_factory=GenerationTally)
    pending: _PendingTasks = field(default_factory=_PendingTasks)
    paused: bool = False
    # Generated groups filtered, failed or expired on arrival since the last one kept COMPLETED
    # (a run that cannot make progress stops with an error instead of spinning), by cause,
    # with the last reason seen for each cause (`stall_message` names the real one).
    dropped_in_a_row: int = 0
    drop_causes: Counter = field(default_factory=Counter)
    last_drop_reason: dict = field(default_factory=dict)
    # The distillation teacher that scores this task's groups once judged (rlharness/teacher/); None: no teacher.
    teacher: Any = None
    # Interruptions after which a group is FAILED instead of restarted (0 = never; strategy.abort_cap()).
    abort_cap: int = 0
    # The last fill found nothing left to draw (allow_epoch_rollover=false), see strategies._fill.
    data_exhausted: bool = False
    # What a member that failed for a reason not the policy's does to its group (algo.failed_member_policy).
    failed_member_policy: str = "mask"
    # Tail-batch bookkeeping, for metrics and tests.
    tail_rounds: int = 0
    last_round_tail: bool = False

    def __post_init__(self) -> None:
        self.pending.on_any_done = self._task_done
        self._collect_error: BaseException | None = None
        # Built once, not per group scheduled.
        self._generate_fns = {flag: self._make_generate_fn(flag) for flag in (False, True)}
        self._take_fns = {flag: (lambda flag=flag: self.take_group(flag)) for flag in (False, True)}

    # ------------------------------------------------------------------ progress
    def target(self) -> int:
        target = self.progress.target_samples[self.task]
        return target if self.target_cap is None else min(target, self.target_cap())

    def available(self) -> int:
        """Groups produced so far that count toward the target: consumed + waiting COMPLETED."""
        return self.progress.consumed_samples[self.task] + self.replay_buffer.count(self.task, Status.COMPLETED)

    def admission_room(self) -> int:
        """The most groups that may be in flight now within the bound of the engines' weights."""
        p = self.progress
        return self.staleness.admission_room(
            self.task, model_step=self.model_step(), next_train_step=p.next_consumer_step,
            consumed=p.consumed_samples[self.task], available=self.available(), step_size=self._step_size)

    def _step_size(self, step: int) -> int:
        return self.task_batch_size if self.step_size is None else self.step_size(step)

    def _stamp_admission(self, group: Group) -> None:
        """Stamp a group that starts without tokens with its admission (module docstring)."""
        if group.admission is not None and any(s.response_ids for s in group.samples):
            return  # a continuation keeps the admission it started with
        p = self.progress
        # Its place among the groups produced or in flight beyond consumption (this one included; it is
        # not in the pending set yet), counted in the batches of the steps from the consumer's next one.
        ahead = self.available() - p.consumed_samples[self.task] + self.pending.count() + 1
        step = p.next_consumer_step
        if self.step_size is None:
            step += math.ceil(ahead / self.task_batch_size) - 1
        else:  # per-step sizes vary (several tasks); a task that left the mix has none: stop looking
            budget = self._step_size(step)
            while budget < ahead and step < p.next_consumer_step + ahead:
                step += 1
                budget += self._step_size(step)
        self.staleness.stamp(group, version=self.model_step(), step=step)

    def expired_count(self) -> int:
        return self.replay_buffer.count(self.task, Status.EXPIRED)

    def should_stop(self) -> bool:
        return self.paused

    # ------------------------------------------------------------------ generation
    def take_group(self, from_expired_only: bool = False) -> Group:
        return self.sampler.sample(from_expired_only=from_expired_only)

    def start(self, group: Group, enable_partial_rollout: bool) -> asyncio.Task:
        """Start generating `group` and track it (with its input) in the pending set."""
        return self.pending.spawn(group, self._generate_fns[bool(enable_partial_rollout)])

    def schedule_one(self, *, max_pending: int, enable_partial_rollout: bool, from_expired_only: bool) -> bool:
        return self.pending.schedule_one(
            max_pending=max_pending,
            should_stop=self.should_stop,
            take_group=self._take_fns[bool(from_expired_only)],
            make_coro=self._generate_fns[bool(enable_partial_rollout)],
        )

    def _make_generate_fn(self, enable_partial_rollout: bool):
        # The agent loop's coroutine itself is the task (no wrapper frame per group); read
        # `self.agent_loop` at each call, so a replaced loop takes effect. Called after the
        # pending set recorded the group as started, so the stamp is undone with a restore.
        def generate(group: Group):
            self._stamp_admission(group)
            if self.teacher is not None:
                return self._generate_and_score(group, enable_partial_rollout)
            return self.agent_loop.generate_group(group, enable_partial_rollout)
        return generate

    async def _generate_and_score(self, group: Group, enable_partial_rollout: bool) -> Group:
        """Generate and judge, then the teacher scores a group that will be kept (not an aborted, failed
        or filtered one: nothing would train on its scores). Inside the group's task, so an interruption
        puts it back as started, as one of generation."""
        group = await self.agent_loop.generate_group(group, enable_partial_rollout)
        if group.status == Status.COMPLETED and self.group_filter(group) is None:
            await self.teacher.score_or_fail(group)
        return group

    def _task_done(self, task: asyncio.Task) -> bool:
        """Done-callback of every generation task: a COMPLETED group goes into the buffer right
        here, and the producer is woken only when it has something to decide (the target met) —
        not once per group (overhead benchmark). Anything else (a filtered, aborted or failed
        group: a gap to refill; a crash; a cancellation; anything during a pause) is left to
        the producer's `collect`, which also keeps its oldest-first order: aborts finish in the
        engine's order, which need not be deterministic. Returns whether to wake the producer."""
        if (not self.paused and self._collect_error is None and not task.cancelled() and task.exception() is None
                and task.result().status == Status.COMPLETED and not has_infra_failures(task.result())
                and self.group_filter(task.result()) is None):
            if self.pending.claim_one(task) is not None:
                try:
                    stored = self._put(task.result(), known_kept=True)
                except BaseException as exc:  # noqa: BLE001 - re-raised by the producer's next collect
                    self._collect_error = exc
                else:
                    if stored == Status.COMPLETED and self.available() < self.target():
                        return False
        self.producer_wake.set()
        return True

    async def wait_and_collect(self, timeout_s: float) -> int:
        """Wait for some task to finish (or a wake-up) and put whatever finished; returns groups put."""
        if not self.pending.count():  # nothing may start now (admission room): wait for new weights
            await self.producer_wake.wait(timeout_s)
            return 0
        done = await self.pending.wait_any(timeout_s, wake=self.producer_wake)
        return self.collect(self.pending.claim(done))

    # ------------------------------------------------------------------ results
    def collect(self, claimed: Claimed) -> int:
        if self._collect_error is not None:  # putting a finished group failed in its done-callback
            exc, self._collect_error = self._collect_error, None
            raise exc
        for task, started in claimed:
            self._put(self._outcome(task, started))
        return len(claimed)

    def _outcome(self, task: asyncio.Task, started: Started) -> Group:
        if not task.done() or task.cancelled():
            self.window["groups_cancelled"] += 1
            # A task that has not stopped may still write to its live states: give back a copy then.
            return (started.restore() if task.done() else started.copy_as_started()).mark_aborted()
        exc = task.exception()
        if exc is not None:
            input_group = started.restore()
            input_group.num_crashes += 1
            crashes = input_group.num_crashes
            log.error("task %s: agent loop crashed on group %s (%d time(s)): %r",
                      self.task, input_group.group_id, crashes, exc, exc_info=exc)
            if crashes >= MAX_CRASHES_PER_GROUP:
                return input_group.mark_failed(f"agent loop crashed {crashes} times, last: {exc!r}")
            return input_group.mark_aborted()
        return task.result()

    def _cap_aborts(self, group: Group) -> Status:
        aborts = max(s.num_aborts for s in group)
        if aborts < self.abort_cap:
            return Status.ABORTED
        reason = (f"interrupted {aborts} times without partial rollout (strategy.max_aborts={self.abort_cap}): "
                  f"longer than the time between weight syncs? strategy.enable_partial_rollout=true keeps its tokens")
        group.mark_failed(reason)
        self.window["groups_abort_capped"] += 1
        return Status.FAILED

    def _put(self, group: Group, known_kept: bool = False) -> Status:
        """Filter, count and store one returned group; returns the status it was stored under.
        `known_kept`: the caller found it COMPLETED and not filtered (no second check)."""
        status = Status.COMPLETED if known_kept else group.status
        if status == Status.ABORTED and self.abort_cap:
            status = self._cap_aborts(group)
        if status == Status.COMPLETED and not known_kept:
            self.window["members_failed_infra"] += sum("infra_failure" in s.extra for s in group)
            reason = settle(group, self.failed_member_policy)
            if reason is not None:
                log.warning("task %s: group %s FAILED: %s", self.task, group.group_id, reason[:300])
                group.mark_failed(reason)
                status = Status.FAILED
        if status == Status.COMPLETED and not known_kept:
            reason = self.group_filter(group)
            if reason is not None:
                group.mark_filtered(reason)
                status = Status.FILTERED
        window = self.window
        window["groups_generated"] += 1
        window["samples_generated"] += len(group)
        window["tokens_generated"] += group.num_response_tokens()
        if status in (Status.COMPLETED, Status.FILTERED):  # judged: rewards before any filter (seeds' raw_rewards)
            scores = [s.reward["score"] for s in group if s.reward is not None and "score" in s.reward]
            window["raw_reward_sum"] += sum(scores)
            window["raw_reward_sq_sum"] += sum(x * x for x in scores)
            window["raw_reward_count"] += len(scores)
            self.tally.add_generated(group)
        if status == Status.FILTERED:
            self.window["groups_filtered"] += 1
            self.tally.add_dropped([len(s.response_ids) for s in group])
        elif status == Status.FAILED:
            self.window["groups_failed"] += 1
        elif status == Status.ABORTED:
            self.window["groups_aborted"] += 1
        stored = self.replay_buffer.put(group, model_step=self.model_step(),
                                        train_step=self.progress.next_consumer_step, status=status)
        if stored == Status.COMPLETED:
            self.dropped_in_a_row = 0
            self.drop_causes.clear()
        elif status in (Status.FILTERED, Status.FAILED, Status.COMPLETED):  # COMPLETED -> expired on arrival
            self.dropped_in_a_row += 1
            cause, reason = drop_cause(group, status)
            self.drop_causes[cause] += 1
            self.last_drop_reason[cause] = reason
        self.on_put()
        fault_points.reach("group_put")
        return stored


def drop_cause(group: Group, status: Status) -> tuple[str, str]:
    """(cause, reason) of a group dropped on arrival: judging | teacher | infra | crash | aborts | filter | expiry."""
    if status == Status.FILTERED:
        return "filter", group.drop_reason or "filtered"
    if status == Status.FAILED:
        reason = group.drop_reason or "failed"
        if reason.startswith("judger "):
            return "judging", reason
        if reason.startswith("teacher "):
            return "teacher", reason
        if reason.startswith(INFRA_PREFIX):
            return "infra", reason
        return ("aborts" if reason.startswith("interrupted ") else "crash"), reason
    return "expiry", "expired on arrival (too stale)"


_STALL_HINTS = {
    "judging": "the judger is failing: check it (judger.*, agent.judge_timeout_s)",
    "crash": "the agent loop keeps crashing (see the log)",
    "teacher": "the distillation teacher fails to score groups (algo.teacher.*; see the last reason)",
    "infra": "members keep failing for reasons that are not the policy's (agent programs crashing or timing out, "
             "the tool sandbox, the judger's limits; each reason and traceback is in rollouts/dropped.jsonl)",
    "aborts": "groups are interrupted too often (strategy.max_aborts; see the last reason)",
    "filter": "strategy.group_filter drops every group (every member of a group scores the same: is the "
              "task too hard or too easy for the model?)",
    "expiry": "groups expire on arrival: the engines' weights lag the trainer by more than max_staleness "
              "allows (are they synced after each step?)",
}


def stall_message(ctx: ProduceContext, group_filter: str) -> str:
    """Why production cannot make progress, from what actually happened to the last groups."""
    cause, _ = ctx.drop_causes.most_common(1)[0] if ctx.drop_causes else ("expiry", 0)
    parts = ", ".join(f"{n} {c}" for c, n in ctx.drop_causes.most_common())
    return (
        f"task {ctx.task}: production cannot make progress: the last {ctx.dropped_in_a_row} generated groups "
        f"were all dropped ({parts}; strategy.group_filter={group_filter}, weight version {ctx.model_step()}, "
        f"consumer step {ctx.progress.next_consumer_step}): {_STALL_HINTS[cause]}. Last reason: "
        f"{ctx.last_drop_reason.get(cause, '?')[:300]}. Every dropped group is in rollouts/dropped.jsonl."
    )
