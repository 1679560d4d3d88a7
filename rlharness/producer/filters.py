"""Group filters: decide that a COMPLETED group carries no learning signal.

A filter returns the reason to drop a group, or None to keep it. The strategy
marks a dropped group FILTERED (the ledger records the reason) and refills the gap.
"""

from __future__ import annotations

from typing import Callable

from rlharness.core.types import Group

GroupFilter = Callable[[Group], "str | None"]


def keep_all(group: Group) -> str | None:
    return None


def all_equal_reward(group: Group) -> str | None:
    """DAPO's dynamic sampling: equal rewards give zero advantage to every member."""
    scores = [s.reward["score"] if s.reward is not None else None for s in group]
    if None in scores:
        return None  # unjudged members: nothing to compare (not a COMPLETED group)
    if len(set(scores)) == 1:
        return f"all_equal_reward: every member scored {scores[0]}"
    return None


GROUP_FILTERS: dict[str, GroupFilter] = {"none": keep_all, "all_equal_reward": all_equal_reward}


def build_group_filter(name: str) -> GroupFilter:
    if name not in GROUP_FILTERS:
        raise ValueError(f"strategy.group_filter={name!r} is not one of {sorted(GROUP_FILTERS)}")
    return GROUP_FILTERS[name]
