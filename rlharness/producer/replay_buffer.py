"""The replay buffer: every group that left the sampler and is not in flight lives here.

Groups are kept per task and per group status (FIFO within a pool), so counts are
O(1). COMPLETED groups wait for the trainer (`take_batch`, stalest first); ABORTED
and EXPIRED groups wait for the sampler to hand them out again; FILTERED and FAILED
groups are counted and handed to a `dropped` list that the trainer drains into the
ledger (`rollouts/dropped.jsonl`), never kept here.

Staleness: the run's `StalenessPolicy` (producer/staleness.py) says when a kept group is
too stale (`expired`: token mode, the bound of its task). An expired group loses its
responses and goes back to the sampler instead of being dropped, so slow prompts are
not silently skipped (tinker-cookbook PR #822). In admission mode the bound is held
where groups start and nothing kept here ever expires for staleness: a started group
is continued, not thrown away.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import Any, Iterable

from rlharness.producer.legacy_state import groups_of_format_1
from rlharness.producer.staleness import StalenessPolicy
from rlharness.core.types import Group, Status, stable_seed

log = logging.getLogger(__name__)

# Pools a group can wait in; FILTERED/FAILED go to the dropped list instead.
KEPT_STATUSES = (Status.COMPLETED, Status.ABORTED, Status.EXPIRED)
DROPPED_STATUSES = (Status.FILTERED, Status.FAILED)

# The layout of `state_dict`: 2 = groups as `Group.to_dict` (1: lists of sample dicts with the
# producer's bookkeeping in each sample's `extra`; still read, see producer/legacy_state.py).
STATE_FORMAT = 2


def _expire(group: Group) -> int:
    """Clear the responses of a too-stale group; returns the number of tokens thrown away.

    Each sample also gets a new seed (a function of the old one and the expiry count, so
    runs stay reproducible): with seeded sampling the same seed on barely changed weights
    would replay the response that just expired, and one too long for the staleness
    window would expire on every try.
    """
    wasted = group.num_response_tokens()
    group.num_expired += 1
    for s in group:
        s.reset_response()
        s.status = Status.EXPIRED
        s.sample_seed = stable_seed(s.sample_seed, "expired", group.num_expired)
    return wasted


class ReplayBuffer:
    def __init__(self, staleness: StalenessPolicy) -> None:
        """`staleness`: the run's policy (built once, shared with the producer)."""
        self.staleness = staleness
        # task -> status -> group_id -> group (insertion order = FIFO)
        self._pools: dict[str, dict[Status, OrderedDict[str, Group]]] = {}
        self._dropped: list[Group] = []  # each with its drop_reason
        # Cumulative counters (part of the checkpoint) for metrics and accounting.
        self.counters: Counter[str] = Counter()
        # Every COMPLETED/ABORTED group held is known not to be too stale at this train step, so
        # `refresh_staleness` at the same or an earlier step has nothing to do (staleness only
        # grows with the step). The consumer refreshes on every wake-up; a rescan of the whole
        # buffer each time made a step quadratic in the groups buffered (overhead benchmark).
        self._checked_step = 0
        # Oldest token version of every COMPLETED/ABORTED group held (by group id), computed once
        # at `put`: expiry checks and the stalest-first order of `take_batch` read it instead of
        # walking every member's versions again at each step (overhead benchmark).
        self._oldest: dict[str, float] = {}
        # Response lengths of finished (COMPLETED) samples that expired, since the producer last took them:
        # what staleness drops, by length (rlharness/health/bias.py).
        self.expired_lengths: list[int] = []

    # ------------------------------------------------------------------ pools
    def _pool(self, task: str, status: Status) -> OrderedDict[str, Group]:
        if status not in KEPT_STATUSES:
            raise ValueError(f"replay buffer keeps no {status.value} pool (kept: {[s.value for s in KEPT_STATUSES]})")
        pools = self._pools.get(task)
        if pools is None:  # not setdefault: that built three OrderedDicts on every call (overhead benchmark)
            pools = self._pools[task] = {st: OrderedDict() for st in KEPT_STATUSES}
        return pools[status]

    def count(self, task: str, status: Status) -> int:
        return len(self._pool(task, status))

    def counts(self) -> dict[str, int]:
        """Groups held, by status, over all tasks."""
        return {st.value: sum(len(p[st]) for p in self._pools.values()) for st in KEPT_STATUSES}

    def tasks(self) -> list[str]:
        return list(self._pools)

    def groups(self, task: str, status: Status) -> list[Group]:
        """The groups of one pool, oldest first (read-only view for tests and metrics)."""
        return list(self._pool(task, status).values())

    def pop_group(self, task: str, status: Status) -> Group | None:
        """The oldest group of one pool, or None if it is empty (the sampler's entry point)."""
        pool = self._pool(task, status)
        if not pool:
            return None
        gid, group = pool.popitem(last=False)
        self._oldest.pop(gid, None)
        return group

    # ------------------------------------------------------------------ put
    def put(self, group: Group, model_step: int, train_step: int, status: Status | None = None) -> Status:
        """Store a group coming back from generation; returns the status it was stored under.

        `model_step` is the producer's weight version when the group came back,
        `train_step` the earliest step it can be trained at (the consumer's next step);
        `status`, if the caller has it, is the group's (`Group.status`).
        """
        if not group.samples:
            raise ValueError(f"ReplayBuffer.put: group {group.group_id} has no samples")
        task = group.task
        group.put_model_step, group.put_train_step = model_step, train_step
        if status is None:
            status = group.status
        if status == Status.INIT:  # returned without being generated at all
            status = group.mark_aborted().status
        if status in DROPPED_STATUSES:
            if group.drop_reason is None:
                group.drop_reason = status.value
            self.counters[f"dropped_{status.value}"] += 1
            self._dropped.append(group)
            return status
        if status not in KEPT_STATUSES:
            raise ValueError(f"ReplayBuffer.put: group {group.group_id} has status {status.value}")
        gid = group.group_id
        if status in (Status.COMPLETED, Status.ABORTED):
            oldest = group.oldest_version()
            if self.staleness.expired(oldest, train_step, task):
                self._expire_into_pool(group, finished=status == Status.COMPLETED)
                return Status.EXPIRED
            if status == Status.ABORTED:
                self.counters["aborted"] += 1
            self._checked_step = min(self._checked_step, train_step)
            self._oldest[gid] = oldest
        self._pool(task, status)[gid] = group
        return status

    def _expire_into_pool(self, group: Group, finished: bool) -> None:
        if finished:
            self.expired_lengths += [len(s.response_ids) for s in group.samples]
        self.counters["expired_tokens"] += _expire(group)
        self.counters["expired"] += 1
        self._pool(group.task, Status.EXPIRED)[group.group_id] = group

    def refresh_staleness(self, train_step: int) -> int:
        """Expire every kept group that would be too stale at `train_step`; returns how many."""
        if train_step <= self._checked_step or not self.staleness.expires:
            return 0
        self._checked_step = train_step
        expired = 0
        for task, pools in self._pools.items():
            for status in (Status.COMPLETED, Status.ABORTED):
                stale = [gid for gid in pools[status] if self.staleness.expired(self._oldest[gid], train_step, task)]
                for gid in stale:
                    del self._oldest[gid]
                    self._expire_into_pool(pools[status].pop(gid), finished=status == Status.COMPLETED)
                expired += len(stale)
        if expired:
            log.info("replay buffer: %d group(s) expired at train step %d", expired, train_step)
        return expired

    # ------------------------------------------------------------------ take
    def ready(self, task_sizes: dict[str, int]) -> bool:
        return all(self.count(task, Status.COMPLETED) >= n for task, n in task_sizes.items())

    def take_batch(self, task_sizes: dict[str, int], train_step: int | None = None) -> list[Group]:
        """Pop `task_sizes[task]` COMPLETED groups per task, stalest (oldest version) first.

        With `train_step`, staleness is refreshed first so nothing past the bound is taken.
        Raises if any task lacks enough groups (callers check `ready` first).
        """
        if train_step is not None:
            self.refresh_staleness(train_step)
        if not self.ready(task_sizes):
            have = {t: self.count(t, Status.COMPLETED) for t in task_sizes}
            raise RuntimeError(f"take_batch: wanted {task_sizes} COMPLETED groups, have {have}")
        batch: list[Group] = []
        for task, n in task_sizes.items():
            pool = self._pool(task, Status.COMPLETED)
            # Oldest version first; insertion order breaks ties (sorted is stable).
            order = sorted(pool, key=self._oldest.__getitem__)
            for gid in order[:n]:
                del self._oldest[gid]
                batch.append(pool.pop(gid))
        return batch

    # ------------------------------------------------------------------ dropped ledger
    def pop_dropped(self) -> list[Group]:
        """The FILTERED and FAILED groups put since the last call, each with its `drop_reason`."""
        out, self._dropped = self._dropped, []
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self, in_flight: Iterable[Group] = ()) -> dict[str, Any]:
        """Every group held, plus `in_flight` groups saved as ABORTED (copies; nothing live mutated)."""
        groups = [g.to_dict() for pools in self._pools.values() for pool in pools.values() for g in pool.values()]
        groups += [g.clone().mark_aborted().to_dict() for g in in_flight]
        return {
            "format": STATE_FORMAT,
            **self.staleness.state_dict(),
            "groups": groups,
            "dropped": [g.to_dict() for g in self._dropped],
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of this format or of format 1 (written before groups had a type of their own)."""
        fmt = state.get("format", 1)
        if fmt == 1:
            groups, dropped = groups_of_format_1(state)
        elif fmt == STATE_FORMAT:
            groups = [Group.from_dict(d) for d in state["groups"]]
            dropped = [Group.from_dict(d) for d in state["dropped"]]
        else:
            raise ValueError(f"replay buffer state format {fmt!r} is not one this code reads (1, {STATE_FORMAT}): "
                             f"resume with the version of rlharness that wrote the checkpoint")
        self._pools.clear()
        self._oldest.clear()
        self._checked_step = 0
        for group in groups:
            status = group.status
            self._pool(group.task, status)[group.group_id] = group
            if status in (Status.COMPLETED, Status.ABORTED):
                self._oldest[group.group_id] = group.oldest_version()
        self._dropped = dropped
        self.counters = Counter(state["counters"])

