"""The producer's hot-path pieces: clone, make_group seeds, uids, group status, Signal, GC tuning, eager collection."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest

from rlharness.core.gc_tuning import GC_THRESHOLDS, tune_gc, untune_gc
from rlharness.producer.context import Signal
from rlharness.producer.pending import _PendingTasks
from rlharness.core.types import Admission, Group, RolloutState, Status, make_group, member_seeds, new_uid


def _named(name: str):
    """A one-member group whose prompt text is `name`."""
    return make_group(task="t", prompt_index=0, epoch=0, prompt_text=name, prompt_ids=[1], label={}, k=1)


def _full_state() -> RolloutState:
    s = make_group(task="t", prompt_index=3, epoch=1, prompt_text="p", prompt_ids=[5, 6],
                   label={"answer": "4", "numbers": [1, 2]}, k=1, seed=7).samples[0]
    s.append_tokens([1, 2], [-0.1, -0.2], [0, 1])
    s.response_text, s.reward, s.status, s.finish_reason, s.num_aborts = "12", {"score": 1.0}, Status.COMPLETED, "stop", 2
    s.extra.update(generate_s=0.5, history=[{"turn": 1}])
    return s


def test_clone_is_an_equal_deep_copy_of_every_field():
    s = _full_state()
    c = s.clone()
    assert c == s and type(c) is RolloutState
    for name in ("response_ids", "response_logprobs", "response_model_steps", "response_mask", "reward", "extra"):
        assert getattr(c, name) is not getattr(s, name), name
    assert c.prompt_ids is s.prompt_ids and c.label is s.label  # read-only: shared
    assert c.extra["history"][0] is not s.extra["history"][0]  # nested containers are copied too
    c.response_ids.append(9)
    c.extra["generate_s"] = 1.0
    c.reward["score"] = 0.0
    assert s.response_ids == [1, 2] and s.extra["generate_s"] == 0.5 and s.reward == {"score": 1.0}


def test_make_group_seeds_depend_on_the_sample_alone_and_differ_between_members():
    g = make_group(task="math", prompt_index=11, epoch=2, prompt_text="q", prompt_ids=[1], label={}, k=5, seed=3)
    assert [s.sample_seed for s in g] == member_seeds(3, "math", 2, 11, 5)
    # A group of more than 8 (two digests) starts with the same seeds; every part of the place matters.
    assert member_seeds(3, "math", 2, 11, 20)[:5] == member_seeds(3, "math", 2, 11, 5)
    assert len(set(member_seeds(3, "math", 2, 11, 20))) == 20
    others = [member_seeds(4, "math", 2, 11, 5), member_seeds(3, "code", 2, 11, 5), member_seeds(3, "math", 1, 11, 5),
              member_seeds(3, "math", 2, 12, 5)]
    assert all(not set(o) & set(member_seeds(3, "math", 2, 11, 5)) for o in others)
    assert all(0 <= x < 2**63 for x in member_seeds(3, "math", 2, 11, 20))
    # The same in every process (not hash()-salted): a fixed value pins the derivation.
    assert member_seeds(0, "t", 0, 0, 1) == [int.from_bytes(__import__("hashlib").blake2b(
        repr((0, "t", 0, 0, 0)).encode(), digest_size=64).digest()[:8], "little") >> 1]
    assert len({s.uid for s in g}) == 5 and len({s.group_id for s in g}) == 1
    assert all(s.status == Status.INIT and s.response_ids == [] and s.extra == {} for s in g)
    assert (g.task, g.prompt_index, g.epoch, g.prompt_text) == ("math", 11, 2, "q") and g.is_pristine()
    g.samples[0].response_ids.append(1)
    assert g.samples[1].response_ids == []  # members share no response list
    assert all(s.prompt_ids is g.samples[0].prompt_ids and s.label is g.label for s in g)  # one read-only prompt


def test_append_tokens_extends_an_explicit_mask_and_makes_an_implicit_one_explicit():
    s = _full_state()
    s.append_tokens([3], [-0.3], [1], mask=[0])
    assert s.response_mask == [1, 1, 0] and s.loss_mask() == [1, 1, 0]
    legacy = _full_state()
    legacy.response_mask = []  # a state from before the mask existed: implicit ones
    legacy.append_tokens([3], [-0.3], [1])
    assert legacy.response_mask == [1, 1, 1]


def test_new_uid_is_16_hex_digits_and_differs_in_a_forked_child():
    uids = {new_uid() for _ in range(1000)}
    assert len(uids) == 1000 and all(len(u) == 16 and int(u, 16) >= 0 for u in uids)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's next uid must not repeat the parent's next one
        os.write(w, new_uid().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 16).decode() != new_uid()


@pytest.mark.parametrize("statuses,expected", [
    ([Status.COMPLETED] * 3, Status.COMPLETED),
    ([Status.COMPLETED, Status.ABORTED, Status.COMPLETED], Status.ABORTED),
    ([Status.FAILED, Status.ABORTED], Status.FAILED),
    ([Status.ARCHIVED, Status.INIT], Status.INIT),
])
def test_group_status_is_the_worst_member(statuses, expected):
    g = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1], label={}, k=len(statuses))
    for s, st in zip(g, statuses):
        s.status = st
    assert g.status == expected


@pytest.mark.timeout(10)
def test_signal_wakes_waiters_and_times_out():
    async def main():
        sig = Signal()
        assert await sig.wait(0.01) is False
        waiter = asyncio.ensure_future(sig.wait(5))
        await asyncio.sleep(0)
        sig.set()
        assert await waiter is True
        assert await sig.wait(5) is True  # still set
        sig.clear()
        fut = asyncio.get_running_loop().create_future()
        sig.add_waiter(fut)
        sig.remove_waiter(fut)
        sig.set()
        assert not fut.done()  # removed waiters are not resolved

    asyncio.run(main())
    sig = Signal()
    sig.set()  # outside any loop: only the flag
    assert asyncio.run(sig.wait(0.01)) is True  # a later loop sees it


@pytest.mark.timeout(10)
def test_wait_any_wakes_on_a_wakeable_without_a_task_per_wait():
    async def main():
        pending, sig = _PendingTasks(), Signal()
        pending.spawn(_named("g"), lambda g: asyncio.sleep(10, result=g))
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, sig.set)
        before = len(asyncio.all_tasks())
        waiting = asyncio.ensure_future(pending.wait_any(5, wake=sig))
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == before + 1  # only the waiting coroutine itself
        assert await waiting == set()
        await pending.cancel_all(1)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_pending_hook_returning_false_claims_quietly():
    async def main():
        pending, seen = _PendingTasks(), []

        def hook(task):
            seen.append(pending.claim((task,)))
            return False  # handled: nobody needs waking

        pending.on_any_done = hook
        pending.spawn(_named("g"), lambda g: asyncio.sleep(0, result=g))
        pending.spawn(_named("slow"), lambda g: asyncio.sleep(10, result=g))
        done = await pending.wait_any(0.1)
        assert done == set() and len(seen) == 1 and pending.count() == 1
        assert seen[0][0][1].group.prompt_text == "g"
        await pending.cancel_all(1)

    asyncio.run(main())


def test_tune_gc_freezes_and_sets_thresholds_and_untune_restores():
    before = gc.get_threshold()
    previous = tune_gc()
    try:
        assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
    finally:
        untune_gc(previous)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_started_resets_a_pristine_group_in_place_and_copies_any_other_at_the_start():
    from rlharness.producer.pending import Started

    fresh = make_group(task="t", prompt_index=0, epoch=0, prompt_text="f", prompt_ids=[1], label={}, k=2)
    started = Started(fresh)
    member = fresh.samples[0]
    member.append_tokens([1], [-0.1], [0])
    member.status, member.response_text, member.extra["generate_s"] = Status.COMPLETED, "1", 0.1
    fresh.admission = Admission(version=0, step=1, max_staleness=0)  # stamped once started
    fresh.mark_failed("judger down")
    copy = started.copy_as_started()
    assert member.response_ids == [1] and fresh.admission is not None  # the live group untouched
    assert copy.is_pristine() and [s.uid for s in copy] == [s.uid for s in fresh]
    assert started.restore() is fresh and fresh.is_pristine() and fresh.admission is None and fresh.drop_reason is None

    cont = Group.from_samples([_full_state()], num_crashes=1)
    cont.samples[0].status = Status.ABORTED
    started = Started(cont)
    cont.samples[0].append_tokens([3], [-0.3], [2])
    cont.num_crashes = 2
    restored = started.restore()
    assert restored is not cont and restored.samples[0].response_ids == [1, 2] and restored.num_crashes == 1
    assert cont.samples[0].response_ids == [1, 2, 3]
