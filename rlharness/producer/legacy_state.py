"""Replay buffer states of format 1, written before a group had a type of its own.

Format 1 saved each group as the list of its samples' dicts (`RolloutState.to_dict`), the
producer's bookkeeping repeated in every sample's `extra`, and each dropped group as
`[samples, reason]`. Here those keys become the `Group`'s fields (the judger's `judge_limit`
the sample's), and `extra` keeps the agent's data, so a checkpoint written then resumes as it
would have.
"""

from __future__ import annotations

from typing import Any

from rlharness.core.types import Admission, Group, RolloutState

# Format 1's `extra` keys that are the group's: these became Group fields of the same names.
_GROUP_KEYS = ("num_expired", "num_crashes", "put_model_step", "put_train_step")
_ADMISSION_KEYS = ("admit_version", "admit_step", "max_staleness")
_REASON_KEYS = ("fail_reason", "filter_reason")  # the first found was the drop reason


def groups_of_format_1(state: dict[str, Any]) -> tuple[list[Group], list[Group]]:
    """(groups held, groups dropped) of a format-1 replay buffer state."""
    groups = [group_of_format_1(samples) for samples in state["groups"]]
    dropped = [group_of_format_1(samples, reason) for samples, reason in state["dropped"]]
    return groups, dropped


def group_of_format_1(sample_dicts: list[dict[str, Any]], drop_reason: str | None = None) -> Group:
    """One format-1 group; the bookkeeping (the same in every member) is read from the first member holding it."""
    samples, found = [], {}
    for d in sample_dicts:
        extra = dict(d["extra"])
        judge_limit = extra.pop("judge_limit", None)
        for key in (*_GROUP_KEYS, *_ADMISSION_KEYS, *_REASON_KEYS):
            if key in extra:
                found.setdefault(key, extra.pop(key))
        samples.append(RolloutState.from_dict({**d, "extra": extra, "judge_limit": judge_limit}))
    if drop_reason is None:
        drop_reason = next((str(found[key]) for key in _REASON_KEYS if key in found), None)
    admission = None
    if "admit_step" in found:  # checkpoints older than task bounds have no max_staleness
        admission = Admission(found["admit_version"], found["admit_step"], found.get("max_staleness"))
    return Group.from_samples(samples, admission=admission, drop_reason=drop_reason,
                              **{key: found[key] for key in _GROUP_KEYS if key in found})
