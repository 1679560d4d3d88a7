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

from rlharness.producer.staleness import StalenessPolicy
from rlharness.core.types import Group, RolloutState, Status, group_status, oldest_version, stable_seed

log = logging.getLogger(__name__)

# Pools a group can wait in; FILTERED/FAILED go to the dropped list instead.
KEPT_STATUSES = (Status.COMPLETED, Status.ABORTED, Status.EXPIRED)
DROPPED_STATUSES = (Status.FILTERED, Status.FAILED)


def mark_aborted(group: Group) -> Group:
    """Mark a group that was interrupted (or never started) as ABORTED, in place.

    Members that finished keep COMPLETED and their tokens; the others keep whatever
    partial tokens they hold (the agent loop already reset them when partial rollout
    is off) and become ABORTED, so the group as a whole reports ABORTED.
    """
    for s in group:
        if s.status != Status.COMPLETED:
            s.status = Status.ABORTED
    if group_status(group) != Status.ABORTED:
        for s in group:  # every member finished but the group was never judged
            s.status = Status.ABORTED
    return group


def _expire(group: Group) -> int:
    """Clear the responses of a too-stale group; returns the number of tokens thrown away.

    Each sample also gets a new seed (a function of the old one and the expiry count, so
    runs stay reproducible): with seeded sampling the same seed on barely changed weights
    would replay the response that just expired, and one too long for the staleness
    window would expire on every try.
    """
    wasted = sum(len(s.response_ids) for s in group)
    for s in group:
        s.reset_response()
        s.status = Status.EXPIRED
        s.extra["num_expired"] = int(s.extra.get("num_expired", 0)) + 1
        s.sample_seed = stable_seed(s.sample_seed, "expired", s.extra["num_expired"])
    return wasted


class ReplayBuffer:
    def __init__(self, staleness: StalenessPolicy) -> None:
        """`staleness`: the run's policy (built once, shared with the producer)."""
        self.staleness = staleness
        # task -> status -> group_id -> group (insertion order = FIFO)
        self._pools: dict[str, dict[Status, OrderedDict[str, Group]]] = {}
        self._dropped: list[tuple[Group, str]] = []
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
        `status`, if the caller has it, is the group's (`group_status`).
        """
        if not group:
            raise ValueError("ReplayBuffer.put: empty group")
        task = group[0].task
        for s in group:
            s.extra["put_model_step"] = model_step
            s.extra["put_train_step"] = train_step
        if status is None:
            status = group_status(group)
        if status == Status.INIT:  # returned without being generated at all
            status = group_status(mark_aborted(group))
        if status in DROPPED_STATUSES:
            reason = self._drop_reason(group, status)
            self.counters[f"dropped_{status.value}"] += 1
            self._dropped.append((group, reason))
            return status
        if status not in KEPT_STATUSES:
            raise ValueError(f"ReplayBuffer.put: group {group[0].group_id} has status {status.value}")
        gid = group[0].group_id
        if status in (Status.COMPLETED, Status.ABORTED):
            oldest = oldest_version(group)
            if self.staleness.expired(oldest, train_step, task):
                self._expire_into_pool(group, finished=status == Status.COMPLETED)
                return Status.EXPIRED
            if status == Status.ABORTED:
                self.counters["aborted"] += 1
            self._checked_step = min(self._checked_step, train_step)
            self._oldest[gid] = oldest
        self._pool(task, status)[gid] = group
        return status

    @staticmethod
    def _drop_reason(group: Group, status: Status) -> str:
        for s in group:
            for key in ("fail_reason", "filter_reason"):
                if key in s.extra:
                    return str(s.extra[key])
        return status.value

    def _expire_into_pool(self, group: Group, finished: bool) -> None:
        if finished:
            self.expired_lengths += [len(s.response_ids) for s in group]
        self.counters["expired_tokens"] += _expire(group)
        self.counters["expired"] += 1
        self._pool(group[0].task, Status.EXPIRED)[group[0].group_id] = group

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
    def pop_dropped(self) -> list[tuple[Group, str]]:
        out, self._dropped = self._dropped, []
        return out

    def num_dropped_pending(self) -> int:
        return len(self._dropped)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self, in_flight: Iterable[Group] = ()) -> dict[str, Any]:
        """Every group held, plus `in_flight` groups saved as ABORTED (copies; nothing live mutated)."""
        groups = []
        for task, pools in self._pools.items():
            for status, pool in pools.items():
                for g in pool.values():
                    groups.append([s.to_dict() for s in g])
        for g in in_flight:
            groups.append([s.to_dict() for s in mark_aborted([s.clone() for s in g])])
        return {
            **self.staleness.state_dict(),
            "groups": groups,
            "dropped": [[[s.to_dict() for s in g], reason] for g, reason in self._dropped],
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pools.clear()
        self._oldest.clear()
        self._checked_step = 0
        for g in state["groups"]:
            group = [RolloutState.from_dict(d) for d in g]
            status = group_status(group)
            self._pool(group[0].task, status)[group[0].group_id] = group
            if status in (Status.COMPLETED, Status.ABORTED):
                self._oldest[group[0].group_id] = oldest_version(group)
        self._dropped = [([RolloutState.from_dict(d) for d in g], reason) for g, reason in state["dropped"]]
        self.counters = Counter(state["counters"])

