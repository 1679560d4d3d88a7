"""A checkpoint written before groups had a type of their own (replay buffer state format 1, main at
7a9457f) resumes and trains exactly like the run left alone.

The sync run of tests/resume is stopped by SIGTERM while it produces step 5: its checkpoint of step 4
holds step 5's finished groups (stamped with their admission) and saves the ones in flight as ABORTED.
Its producer state is rewritten in the old layout (`to_format_1`, which reproduces main's own files:
tests/producer/test_buffer_formats.py), and the resumed run must train the same prompts, responses,
rewards and losses as the reference run (tests/conftest.py).
"""

from __future__ import annotations

import signal

import pytest

from rlharness.core.checkpoint import latest_checkpoint, load_state, save_state
from rlharness.core.fault_points import signal_at
from tests.faults.test_signal_stop import SYNC_STOP
from tests.producer.test_buffer_formats import to_format_1
from tests.resume.test_kill_resume import assert_trains_like, launch

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(900)
def test_a_checkpoint_of_the_old_layout_resumes_and_trains_exactly_like_the_uninterrupted_run(
        tmp_path, sync_reference_run):
    run_dir = tmp_path / "old_layout"
    run_dir.mkdir()
    # The 5th group put of step 5 (steps 1-4 put 8 each): step 4's checkpoint then holds part of step 5's work.
    stopped = launch(run_dir, SYNC_STOP, signal_at(signal.SIGTERM, "group_put", 37))
    assert stopped.wait(timeout=600) == 128 + signal.SIGTERM, stopped.stderr_text()[-3000:]
    step, ckpt = latest_checkpoint(run_dir)
    assert step == 4
    state = load_state(ckpt / "trainer.pt")
    producer = state["producer"]
    held = producer["replay_buffer"]["groups"]
    assert producer["replay_buffer"]["format"] == 2 and len(held) == 8, [g["samples"][0]["status"] for g in held]
    assert sum(g["samples"][0]["status"] == "completed" for g in held) >= 5
    producer["replay_buffer"] = to_format_1(producer["replay_buffer"])
    for sampler in producer["samplers"].values():
        del sampler["format"]  # the sampler's layout had no version then
    save_state(state, ckpt / "trainer.pt")

    resumed = launch(run_dir, SYNC_STOP)
    assert resumed.wait(timeout=600) == 0, resumed.stderr_text()[-3000:]
    assert_trains_like(run_dir, sync_reference_run, total_steps=8)
