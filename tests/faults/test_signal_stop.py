"""SIGTERM / SIGINT at named points (drawn from a seed) of colocated, async and Ray runs, then resume.

Each signal must stop the run cleanly: exit 128 + signum, one line saying what was kept,
a checkpoint of the last completed step (so nothing trained is lost). Resumed to the
end, a sync run trains the same prompts with the same losses as the run left alone; an
async or Ray run loses and duplicates nothing.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from rlharness.core.checkpoint import latest_checkpoint
from rlharness.core.fault_points import signal_at
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import HANG_S, start_cli
from tests.resume.test_kill_resume import (ASYNC, SYNC, assert_nothing_lost_or_duplicated, assert_trains_like, launch,
                                           pick_point, step_rows)

pytestmark = [pytest.mark.slow]

# Checkpoints every 3 steps, so a stop between them has progress of its own to save.
SYNC_STOP = [o for o in SYNC if not o.startswith("save_every=")] + ["save_every=3"]
RAY = ["mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=1", "strategy.over_sample_threshold=0.5",
       "strategy.enable_partial_rollout=true", "batch_size=4", "sampler.prompt_repeat_k=4", "eval_every=0",
       "eval.num_prompts=8", "logger=none", "save_every=4", "total_steps=12",
       "cluster.num_cpus=2"]


def trained_steps(run_dir: Path) -> int:
    return max(step_rows(run_dir), default=0)


def stop_and_resume_until_done(run_dir: Path, overrides: list[str], signals: list[int], seed: int) -> None:
    """Run to the end, each life but the last stopped by one of `signals`, delivered at a named point
    drawn from the seed (mid-production or right after an optimizer step: rlharness/core/fault_points.py)."""
    rng = random.Random(seed)
    for sig in [*signals, None]:
        done = latest_checkpoint(run_dir)
        env = {"RAY_AUTH_MODE": "disabled"}
        if sig is not None:
            env.update(signal_at(sig, *pick_point(rng, overrides, done[0] if done else 0)))
        proc = launch(run_dir, overrides, env)
        try:
            rc = proc.wait(timeout=HANG_S)
            err = proc.stderr_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        if sig is None:
            assert rc == 0, err[-3000:]
            continue
        assert rc == 128 + sig, err[-3000:]
        line = [ln for ln in err.splitlines() if ln.startswith("rlharness: stopped by")]
        assert len(line) == 1 and signal.Signals(sig).name in line[0], err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        # The last trained step is in a complete checkpoint: the stop lost nothing.
        assert (latest_checkpoint(run_dir) or (0,))[0] == trained_steps(run_dir), line[0]


@pytest.mark.timeout(900)
def test_sync_stopped_run_trains_exactly_like_the_uninterrupted_one(tmp_path, sync_reference_run):
    # The reference (tests/conftest.py) is the kill test's run, checkpointed every step: stopping and
    # resuming must not change what is trained, nor must checkpointing every 3 steps instead of every one.
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    stop_and_resume_until_done(run_dir, SYNC_STOP, [signal.SIGTERM, signal.SIGINT], seed=3)
    assert_trains_like(run_dir, sync_reference_run, total_steps=8)


@pytest.mark.timeout(900)
def test_async_stopped_run_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "async"
    run_dir.mkdir()
    stop_and_resume_until_done(run_dir, ASYNC, [signal.SIGINT, signal.SIGTERM], seed=4)
    assert_nothing_lost_or_duplicated(run_dir, total_steps=40, max_staleness=1)


@pytest.mark.ray
@pytest.mark.timeout(3 * HANG_S)  # three lives of a Ray run (140 s alone), each bounded by HANG_S
def test_ray_stopped_run_loses_nothing_and_leaves_no_process(tmp_path):
    run_dir = tmp_path / "ray"
    run_dir.mkdir()
    stop_and_resume_until_done(run_dir, RAY, [signal.SIGTERM, signal.SIGINT], seed=5)
    assert_nothing_lost_or_duplicated(run_dir, total_steps=12, max_staleness=1)


def test_second_signal_exits_at_once_and_stop_timeout_bounds_the_stop():
    """The stop controller's own rules, on this process's real signal handlers. Waits are on events
    (the hard exit's call), never a sleep: the watchdog fires after stop_timeout_s, not before."""
    import threading

    from rlharness.core.stopping import StopController

    exits: list[int] = []
    exited = threading.Event()

    def hard_exit(code: int) -> None:
        exits.append(code)
        exited.set()

    before = signal.getsignal(signal.SIGTERM)  # not SIG_DFL once an in-process Ray has started
    stop = StopController(timeout_s=1.0, hard_exit=hard_exit).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before os.kill returns to Python code
        assert stop.requested and stop.signal_name == "SIGTERM" and exits == []
        assert exited.wait(timeout=HANG_S), "the watchdog should end the stop past stop_timeout_s"
        assert exits == [128 + signal.SIGTERM]
        assert time.monotonic() - stop.received_at >= 1.0
        exited.clear()
        os.kill(os.getpid(), signal.SIGINT)  # a second signal: at once, in its handler
        assert exits == [143, 143]
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.timeout(600)
def test_submitit_preemption_signal_checkpoints_then_requeues(tmp_path):
    """submitit_local delivers its preemption signal (USR2) like Slurm; the job stops cleanly, submitit
    requeues it, and the requeued job resumes from the stop's checkpoint to the end."""
    sweep = tmp_path / "multirun"
    overrides = [o for o in ASYNC if not o.startswith(("total_steps=", "save_every="))] + ["total_steps=30",
                                                                                            "save_every=10"]
    # The job sends itself submitit's signal right after its step 3 (rlharness/core/fault_points.py): the
    # real handlers, at a point that is the same on any machine; the requeued job resumes past it.
    proc = start_cli(["-m", "hydra/launcher=submitit_local", *overrides, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                     env={"WANDB_MODE": "disabled", **signal_at(signal.SIGUSR2, "step_trained", 3)})
    run_dir = sweep / "0"
    try:
        assert proc.wait(timeout=HANG_S) == 0, proc.stderr_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = "".join(p.read_text() for p in sorted((sweep / ".submitit").rglob("*_log.*")))
    assert "rlharness: stopped by SIGUSR2" in logs and "submitit requeues the job" in logs, logs[-3000:]
    assert "Requeued job" in logs, logs[-3000:]
    assert "rlharness: stopped by SIGUSR2 at step 3/" in logs, logs[-3000:]
    assert f"resumed from {run_dir}/checkpoints/step_00000003" in RunDir(run_dir).log().read_text()
    assert [r["step"] for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r] == list(range(1, 31))
    assert_nothing_lost_or_duplicated(run_dir, total_steps=30, max_staleness=1)

