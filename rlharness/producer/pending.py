"""_PendingTasks: the rollout tasks in flight for one task name, each with its input group.

Every method that changes the set is synchronous, so under asyncio's single thread
a check-and-add (`schedule_one`) or a claim cannot interleave with another: a task
is handed to exactly one caller (the producer, a pause, a cancel), never two. Waiting
(`wait_any`) only reports done tasks; the caller must `claim` them afterwards and
handles only what its claim returned.

Agent loops generate in place, so with every task the set keeps what gives its group back
as it was when the task started (`Started`): a cancelled or crashed task still returns
its prompt, untouched, to the buffer (the seed lost those prompts on a pause timeout).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable, Protocol

from rlharness.core.types import Group

log = logging.getLogger(__name__)


class Started:
    """A task's group and how to get it back as it was when the task started.

    A pristine group (fresh from the sampler: the usual case) is reset in place; any
    other (a continuation holding partial tokens, a retry) is copied at the start. No
    copy of every member of every group (overhead benchmark)."""

    __slots__ = ("group", "seq", "_backup")

    def __init__(self, group: Group, seq: int = 0) -> None:
        self.group = group
        self.seq = seq  # spawn order (claims come back oldest first)
        self._backup: Group | None = None if group.is_pristine() else group.clone()

    def restore(self) -> Group:
        """The group as started (the live one reset, or the copy taken at the start)."""
        if self._backup is None:
            self.group.restore_pristine()
            return self.group
        return self._backup

    def copy_as_started(self) -> Group:
        """A copy of the group as started, leaving the live one alone (checkpoints of work in flight)."""
        if self._backup is None:
            copy = self.group.clone()
            copy.restore_pristine()
            return copy
        return self._backup.clone()


Claimed = list[tuple[asyncio.Task, Started]]


class Wakeable(Protocol):
    """A wake-up source that resolves a future directly (no task per wait): see context.Signal."""

    def is_set(self) -> bool: ...

    def add_waiter(self, fut: asyncio.Future) -> None: ...

    def remove_waiter(self, fut: asyncio.Future) -> None: ...


def _wake(fut: asyncio.Future, *_: Any) -> None:
    if not fut.done():
        fut.set_result(None)


class _PendingTasks:
    def __init__(self) -> None:
        # Each task with its Started, which holds its spawn sequence number: claims come back
        # oldest first, whatever the order of the set the caller passes (set order follows memory
        # addresses, so it differs from run to run). Oldest first also sends interrupted groups
        # back to the buffer, and so to the engines after a pause, ahead of younger ones, so they
        # are not left to go stale.
        self._tasks: dict[asyncio.Task, Started] = {}
        self._next_seq = 0
        # Tasks that finished and are not claimed yet (filled by a done-callback), and the future
        # `wait_any` sleeps on: a wake-up costs O(finished), not O(in flight) (overhead benchmark).
        self._finished: dict[asyncio.Task, None] = {}
        self._waiter: asyncio.Future | None = None
        self.max_count_seen = 0  # for the over-sampling budget check
        # Called with every task of the set when it finishes, after it is recorded as finished (one
        # done-callback per task instead of two; the produce context sets it). It may claim the task
        # itself; returning False means nobody needs waking for it (a `wait_any` keeps waiting).
        self.on_any_done: Callable[[asyncio.Task], bool | None] | None = None

    def count(self) -> int:
        return len(self._tasks)

    def input_groups(self) -> list[Group]:
        """Copies of the groups in flight as they were started (the live ones are being generated)."""
        return [started.copy_as_started() for started in self._tasks.values()]

    def spawn(self, group: Group, make_coro: Callable[[Group], Awaitable[Group]],
              on_done: Callable[[asyncio.Task], None] | None = None) -> asyncio.Task:
        started = Started(group, self._next_seq)  # before the coroutine can touch the group
        self._next_seq += 1
        task = asyncio.get_running_loop().create_task(make_coro(group))
        self._tasks[task] = started
        if len(self._tasks) > self.max_count_seen:
            self.max_count_seen = len(self._tasks)
        task.add_done_callback(self._on_task_done)
        if on_done is not None:
            task.add_done_callback(on_done)
        return task

    def _on_task_done(self, task: asyncio.Task) -> None:
        if task in self._tasks:
            self._finished[task] = None
        if self.on_any_done is not None and self.on_any_done(task) is False:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def schedule_one(
        self,
        *,
        max_pending: int,
        should_stop: Callable[[], bool],
        take_group: Callable[[], Group],
        make_coro: Callable[[Group], Awaitable[Group]],
        on_done: Callable[[asyncio.Task], None] | None = None,
    ) -> bool:
        """Check the stop flag and the budget, take a group and start it, with no await in between."""
        if should_stop() or len(self._tasks) >= max_pending:
            return False
        self.spawn(take_group(), make_coro, on_done)
        return True

    def claim(self, tasks: Iterable[asyncio.Task]) -> Claimed:
        """Remove and return those of `tasks` still pending here (others were claimed elsewhere), oldest first."""
        mine = sorted((t for t in set(tasks) if t in self._tasks), key=lambda t: self._tasks[t].seq)
        for t in mine:
            self._finished.pop(t, None)
        return [(t, self._tasks.pop(t)) for t in mine]

    def claim_one(self, task: asyncio.Task) -> Started | None:
        """`claim((task,))` for one task (a done-callback's claim): its Started, or None if claimed elsewhere."""
        started = self._tasks.pop(task, None)
        if started is not None:
            self._finished.pop(task, None)
        return started

    def claim_done(self) -> Claimed:
        """Claim the finished tasks whose done-callback has run (a task that just finished is
        reported one loop turn later, and its callback also ends a `wait_any`)."""
        return self.claim(list(self._finished))

    async def wait_any(self, timeout_s: float, wake: asyncio.Event | Wakeable | None = None) -> set[asyncio.Task]:
        """Wait until a task is done, `wake` is set or `timeout_s` passes; returns done tasks (unclaimed).

        One future and one timer per wait: a `Wakeable` resolves the future itself (an
        asyncio.Event still works, at the cost of a task waiting on it)."""
        if not self._tasks:
            return set()
        if not self._finished and not (wake is not None and wake.is_set()):
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            event_task: asyncio.Task | None = None
            if isinstance(wake, asyncio.Event):
                event_task = loop.create_task(wake.wait())
                event_task.add_done_callback(lambda _t: _wake(waiter))
            elif wake is not None:
                wake.add_waiter(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                if event_task is not None:
                    event_task.cancel()
                elif wake is not None:
                    wake.remove_waiter(waiter)
                if self._waiter is waiter:
                    self._waiter = None
        return set(self._finished)

    async def cancel_all(self, drain_timeout_s: float = 5.0) -> Claimed:
        """Claim everything, cancel it and wait for the cancellations to land.

        Returns the claimed (task, Started) pairs; a task that finished before
        its cancellation landed still carries its result for the caller to use.
        """
        claimed = self.claim(list(self._tasks))
        if not claimed:
            return []
        log.warning("cancelling %d rollout task(s); their prompts go back to the buffer", len(claimed))
        for task, _ in claimed:
            task.cancel()
        _, still = await asyncio.wait([t for t, _ in claimed], timeout=drain_timeout_s)
        if still:
            log.error("%d cancelled rollout task(s) did not stop within %.1fs", len(still), drain_timeout_s)
        return claimed
