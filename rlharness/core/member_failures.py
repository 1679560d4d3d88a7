"""Members that failed for a reason that is not the policy's (infrastructure failures).

An agent program that crashed, hung or never called the model, a tool sandbox that could
not start, a judger that ran past its limits on one response: the member has no reward
that says anything about the policy's tokens. Scoring it 0 (what most harnesses do) teaches
the policy that whatever it wrote there was wrong. Such a member keeps its group's status
and carries the reason in `extra["infra_failure"]` (the agent's own traceback, when there is
one, in `extra["agent_traceback"]`); `algo.failed_member_policy` decides what happens to it:

- mask (default): left out of its group's advantage statistics and of the loss; a group left
  with fewer than two valid members is FAILED with the reason (rollouts/dropped.jsonl).
- zero: scored 0 and trained like the others (the peers' behaviour, for comparison); a group
  in which every member failed is FAILED.
- drop_group: the whole group is FAILED with the member's reason.

`settle` applies the policy to a judged group (the producer, before the group filter);
`masked` says which members the batch leaves out.
"""

from __future__ import annotations

from rlharness.core.types import Group, RolloutState

# How the reason of a group failed by `settle` starts (the producer's stall message tells them apart).
INFRA_PREFIX = "infrastructure failures: "


def infra_failure(s: RolloutState) -> str | None:
    """Why `s` failed for a reason that is not the policy's, or None."""
    return s.extra.get("infra_failure")


def mark_infra_failure(s: RolloutState, reason: str, traceback: str | None = None) -> None:
    """Record an infrastructure failure of `s` (the first one recorded is kept: it is the cause)."""
    if "infra_failure" not in s.extra:
        s.extra["infra_failure"] = reason
        if traceback:
            s.extra["agent_traceback"] = traceback


def has_infra_failures(group: Group) -> bool:
    return any("infra_failure" in s.extra for s in group)


def settle(group: Group, policy: str) -> str | None:
    """Apply `policy` to a judged group's failed members; the reason to fail the whole group, or None."""
    failed = [s for s in group if "infra_failure" in s.extra]
    if not failed:
        return None
    first = f"member {failed[0].uid}: {failed[0].extra['infra_failure']}"
    if policy == "drop_group":
        return f"{INFRA_PREFIX}{len(failed)} of {len(group)} member(s) (algo.failed_member_policy=drop_group); {first}"
    if policy == "zero":
        for s in failed:
            s.reward = {"score": 0.0}
        if len(failed) == len(group):
            return f"{INFRA_PREFIX}every member; {first}"
        return None
    valid = len(group) - len(failed)
    if valid < 2:
        return (f"{INFRA_PREFIX}{valid} valid member(s) left of {len(group)} (a group baseline needs two; "
                f"algo.failed_member_policy=mask); {first}")
    return None


def masked(s: RolloutState, policy: str) -> bool:
    """True when the batch leaves `s` out of its group's statistics and of the loss."""
    return policy == "mask" and "infra_failure" in s.extra
