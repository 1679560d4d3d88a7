"""The replay buffer's and sampler's checkpointed state: versioned, and format 1 (before `Group`) still read.

`fixtures/replay_buffer_format1.pt` holds two replay buffer states written by the code of main at
7a9457f, the last with format 1 (`fixtures/make_format1_states.py` wrote them): a producer's (COMPLETED
ones aside, every kind of group: ABORTED, EXPIRED with `num_expired`, crashed once, in flight, FILTERED and
FAILED ones dropped with their reasons) and the one a SIGTERM'd training run checkpointed (its next
step's COMPLETED groups, stamped). `to_format_1` writes the old layout from a new state; read back by
the buffer and written again it reproduces those files exactly, so it writes what main wrote (the
resume test, tests/resume/test_old_checkpoints.py, relies on that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.producer.producer_harness import TASK, encode, make_rows
from rlharness.config.schema import SamplerConf
from rlharness.core.checkpoint import load_state
from rlharness.core.types import GROUP_FACTS, Admission, Group, Status, make_group
from rlharness.producer.legacy_state import group_of_format_1
from rlharness.producer.replay_buffer import STATE_FORMAT, ReplayBuffer
from rlharness.producer.sampler import Sampler
from rlharness.producer.staleness import StalenessPolicy

FIXTURE = Path(__file__).parent / "fixtures" / "replay_buffer_format1.pt"


def to_format_1(state: dict[str, Any]) -> dict[str, Any]:
    """A replay buffer state of the current format written in format 1's layout (as main at 7a9457f wrote it)."""
    out = {k: v for k, v in state.items() if k not in ("format", "groups", "dropped")}
    out["groups"] = [_samples_of_format_1(g) for g in state["groups"]]
    out["dropped"] = [[_samples_of_format_1(g), g["drop_reason"]] for g in state["dropped"]]
    return out


def _samples_of_format_1(group: dict[str, Any]) -> list[dict[str, Any]]:
    """The members' dicts, each with the group's identity and the producer's bookkeeping in its `extra`."""
    kept = {}
    admission = group["admission"]
    if admission is not None:
        kept.update(admit_version=admission["version"], admit_step=admission["step"])
        if admission["max_staleness"] is not None:
            kept["max_staleness"] = admission["max_staleness"]
    kept.update({k: group[k] for k in ("put_model_step", "put_train_step") if group[k] is not None})
    kept.update({k: group[k] for k in ("num_expired", "num_crashes") if group[k]})
    samples = []
    for s in group["samples"]:
        d = {**{k: group[k] for k in GROUP_FACTS}, **s}
        extra = {**d["extra"], **kept}
        if d.pop("judge_limit") is not None:
            extra["judge_limit"] = s["judge_limit"]
        if group["drop_reason"] is not None:
            extra["fail_reason" if d["status"] == Status.FAILED.value else "filter_reason"] = group["drop_reason"]
        samples.append({**d, "extra": extra})
    return samples


def _buffer_for(state: dict[str, Any]) -> ReplayBuffer:
    """A buffer with the staleness policy a state was written with (a state carries it, for reading)."""
    return ReplayBuffer(StalenessPolicy(max_staleness=state["max_staleness"],
                                        sync_weights_interval=state["sync_weights_interval"],
                                        mode=state["staleness_mode"], task_bounds=state["task_max_staleness"]))


def _by_group(state: dict[str, Any]) -> dict[str, Any]:
    """A format-1 state with its held groups by group id (a buffer keeps them by pool, not in saved order)."""
    return {**state, "groups": {g[0]["group_id"]: g for g in state["groups"]}}


@pytest.mark.parametrize("name", ["producer_run", "stopped_run"])
def test_a_format_1_state_of_main_loads_and_writes_back_unchanged(name):
    old = load_state(FIXTURE)[name]
    assert "format" not in old and old["groups"]
    buffer = _buffer_for(old)
    buffer.load_state_dict(old)
    new = buffer.state_dict()
    assert new["format"] == STATE_FORMAT == 2
    assert not any(s["extra"] for g in new["groups"] + new["dropped"] for s in g["samples"])  # no agent ran here
    assert _by_group(to_format_1(new)) == _by_group(old)
    again = _buffer_for(new)
    again.load_state_dict(new)
    assert again.state_dict() == new


def test_format_1_bookkeeping_becomes_the_groups_fields_and_extra_keeps_the_agents_data():
    old = load_state(FIXTURE)["producer_run"]
    buffer = _buffer_for(old)
    buffer.load_state_dict(old)
    held = [g for st in (Status.COMPLETED, Status.ABORTED, Status.EXPIRED) for g in buffer.groups(TASK, st)]
    assert {g.status for g in held} == {Status.ABORTED, Status.EXPIRED}
    assert all(s.extra == {} and s.group_id == g.group_id for g in held for s in g)
    assert all(g.num_expired == 1 and g.admission is not None for g in buffer.groups(TASK, Status.EXPIRED))
    assert sum(g.num_crashes for g in held) == 1
    dropped = buffer.pop_dropped()
    assert [(g.status, g.drop_reason) for g in dropped] == [
        (Status.FILTERED, "all_equal_reward: every member scored 0.0")] * 2 + [
        (Status.FAILED, "judger raising: ValueError: cannot judge prompt 42")]

    # What the fixtures lack: the judger's note, the agent's keys, an admission from before task bounds.
    s = make_group(task="t", prompt_index=3, epoch=1, prompt_text="p", prompt_ids=[1], label={"answer": "2"},
                   k=1).samples[0].to_dict()
    s["extra"] = {"turns": [{"role": "tool", "text": "2"}], "tool_calls": 1, "judge_limit": "timeout after 2 s",
                  "admit_version": 4, "admit_step": 6, "num_crashes": 2}
    group = group_of_format_1([s], drop_reason=None)
    assert group.admission == Admission(version=4, step=6, max_staleness=None) and group.num_crashes == 2
    assert (group.task, group.prompt_index, group.epoch, group.label) == ("t", 3, 1, {"answer": "2"})
    assert group.samples[0].judge_limit == "timeout after 2 s"
    assert group.samples[0].extra == {"turns": [{"role": "tool", "text": "2"}], "tool_calls": 1}


def test_a_state_of_an_unknown_format_is_refused_naming_it():
    buffer = ReplayBuffer(StalenessPolicy(max_staleness=0))
    state = {**buffer.state_dict(), "format": 3}
    with pytest.raises(ValueError, match=r"replay buffer state format 3 is not one this code reads \(1, 2\)"):
        buffer.load_state_dict(state)
    sampler = Sampler(SamplerConf(prompt_repeat_k=2), TASK, make_rows(4), encode, buffer, 0)
    saved = sampler.state_dict()
    assert saved["format"] == 1
    del saved["format"]  # written before the sampler's state had a format: the same layout
    sampler.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"sampler state format 2 is not one this code reads \(1\)"):
        sampler.load_state_dict({**saved, "format": 2})


def test_a_group_survives_its_plain_data_with_every_field():
    group = make_group(task="t", prompt_index=3, epoch=1, prompt_text="p", prompt_ids=[1, 2], label={"a": [1]}, k=2)
    for s in group:
        s.append_tokens([5], [-0.5], [2])
        s.status, s.reward, s.judge_limit, s.extra = Status.COMPLETED, {"score": 0.0}, "timeout", {"turns": []}
    group.admission, group.num_expired, group.num_crashes = Admission(1, 3, 1), 2, 1
    group.put_model_step, group.put_train_step = 2, 3
    group.mark_filtered("all_equal_reward")
    d = group.to_dict()
    assert not set(GROUP_FACTS) & {k for s in d["samples"] for k in s}  # the identity is written once
    back = Group.from_dict(d)
    assert back == group and all(s.label is back.label for s in back)
