"""Checks of a multi-task run directory against the allocation: the ledger, the final checkpoint."""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path

from rlharness.core.checkpoint import latest_checkpoint, load_state
from rlharness.logging_utils.ledger import read_ledger
from rlharness.producer.progress import BatchAllocation


def producer_state(run_dir: Path) -> dict:
    _, ckpt = latest_checkpoint(run_dir)
    return load_state(ckpt / "trainer.pt")["producer"]


def check_mix_ledger(run_dir: Path, steps: int, batch_size: int, weights: dict[str, float],
                     num_train: dict[str, int], whole_run_share: bool = True) -> BatchAllocation:
    """Every step trained exactly its allocation per task; over the run each task its share to within
    one group; per task and epoch no prompt twice, and every prompt drawn is trained, dropped or in
    the final checkpoint's buffer (so an epoch that ended was drawn whole)."""
    trained, dropped = read_ledger(run_dir)
    state = producer_state(run_dir)
    alloc = BatchAllocation(batch_size, weights)
    alloc.load_state_dict(state["allocation"])  # a task that left the mix is recorded there

    groups_per_step: dict[int, Counter] = defaultdict(Counter)
    for gid, step, task in {(r["group_id"], r["train_step"], r["task"]) for r in trained}:
        groups_per_step[step][task] += 1
    assert sorted(groups_per_step) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        want = {t: n for t, n in alloc.sizes(step).items() if n}
        assert dict(groups_per_step[step]) == want, (step, dict(groups_per_step[step]), want)
    total = Counter()
    for c in groups_per_step.values():
        total.update(c)
    assert dict(total) == {t: n for t, n in alloc.cumulative(steps).items() if n}
    if not alloc.left and whole_run_share:
        w_sum = sum(Fraction(repr(float(w))) for w in weights.values())
        for t, w in weights.items():
            assert abs(total[t] - steps * batch_size * Fraction(repr(float(w))) / w_sum) < 1, (t, total[t])

    buffered = list(state["replay_buffer"]["groups"]) + list(state["replay_buffer"]["dropped"])
    places: dict[str, Counter] = defaultdict(Counter)  # task -> (epoch, prompt) -> groups
    for rows in (trained, dropped):
        for task, epoch, prompt, _gid in {(r["task"], r["epoch"], r["prompt_index"], r["group_id"]) for r in rows}:
            places[task][(epoch, prompt)] += 1
    for g in buffered:
        places[g["task"]][(g["epoch"], g["prompt_index"])] += 1
    for task, sampler in state["samplers"].items():
        seen = places[task]
        twice = {k: n for k, n in seen.items() if n > 1}
        assert not twice, f"task {task}: prompts drawn twice within an epoch: {twice}"
        assert sum(seen.values()) == sampler["drawn"], (task, sum(seen.values()), sampler["drawn"])
        for epoch in range(sampler["epoch"]):  # finished epochs: every prompt once
            assert {p for e, p in seen if e == epoch} == set(range(num_train[task])), (task, epoch)
    return alloc
