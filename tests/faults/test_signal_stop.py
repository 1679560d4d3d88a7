"""SIGTERM / SIGINT at random (seeded) moments of colocated, async and Ray runs, then resume.

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

from rlharness.checkpoint import latest_checkpoint
from rlharness.logging_utils.metrics import read_metrics
from rlharness.run_dir import RunDir
from tests.helpers import start_cli
from tests.resume.test_kill_resume import (ASYNC, SYNC, assert_nothing_lost_or_duplicated, assert_trains_like, launch,
                                           step_rows)

pytestmark = [pytest.mark.slow]

# Checkpoints every 3 steps, so a stop between them has progress of its own to save.
SYNC_STOP = [o for o in SYNC if not o.startswith("save_every=")] + ["save_every=3"]
RAY = ["mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=1", "strategy.over_sample_threshold=0.5",
       "strategy.enable_partial_rollout=true", "batch_size=4", "sampler.prompt_repeat_k=4", "eval_every=0",
       "eval.num_prompts=8", "logger=none", "save_every=4", "timeout_s=120", "total_steps=12",
       "cluster.num_cpus=2"]


def trained_steps(run_dir: Path) -> int:
    return max(step_rows(run_dir), default=0)


def stop_and_resume_until_done(run_dir: Path, overrides: list[str], signals: list[int], seed: int) -> int:
    """Run to the end, sending each signal once at a random moment after some progress; returns how
    many signals stopped a run (a run may finish before its signal)."""
    rng = random.Random(seed)
    stopped = 0
    for sig in [*signals, None]:
        before = trained_steps(run_dir)
        proc = launch(run_dir, overrides, {"RAY_AUTH_MODE": "disabled"})
        try:
            if sig is not None:
                deadline = time.monotonic() + 300
                while trained_steps(run_dir) <= before and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)  # a step trained in this life, then a random moment
                time.sleep(rng.uniform(0.0, 1.0))
                if proc.poll() is None:
                    proc.send_signal(sig)
            rc = proc.wait(timeout=600)
            err = proc.stderr_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        if sig is None or rc == 0:
            assert rc == 0, err[-3000:]
            continue
        stopped += 1
        assert rc == 128 + sig, err[-3000:]
        line = [ln for ln in err.splitlines() if ln.startswith("rlharness: stopped by")]
        assert len(line) == 1 and signal.Signals(sig).name in line[0], err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        # The last trained step is in a complete checkpoint: the stop lost nothing.
        assert latest_checkpoint(run_dir)[0] == trained_steps(run_dir), line[0]
    return stopped


@pytest.mark.timeout(900)
def test_sync_stopped_run_trains_exactly_like_the_uninterrupted_one(tmp_path, sync_reference_run):
    # The reference (tests/conftest.py) is the kill test's run, checkpointed every step: stopping and
    # resuming must not change what is trained, nor must checkpointing every 3 steps instead of every one.
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    assert stop_and_resume_until_done(run_dir, SYNC_STOP, [signal.SIGTERM, signal.SIGINT], seed=3) == 2
    assert_trains_like(run_dir, sync_reference_run, total_steps=8)


@pytest.mark.timeout(900)
def test_async_stopped_run_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "async"
    run_dir.mkdir()
    assert stop_and_resume_until_done(run_dir, ASYNC, [signal.SIGINT, signal.SIGTERM], seed=4) == 2
    assert_nothing_lost_or_duplicated(run_dir, total_steps=40, max_staleness=1)


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_ray_stopped_run_loses_nothing_and_leaves_no_process(tmp_path):
    run_dir = tmp_path / "ray"
    run_dir.mkdir()
    assert stop_and_resume_until_done(run_dir, RAY, [signal.SIGTERM, signal.SIGINT], seed=5) == 2
    assert_nothing_lost_or_duplicated(run_dir, total_steps=12, max_staleness=1)


def test_second_signal_exits_at_once_and_stop_timeout_bounds_the_stop():
    """The stop controller's own rules, on this process's real signal handlers."""
    from rlharness.stopping import StopController

    exits: list[int] = []
    before = signal.getsignal(signal.SIGTERM)  # not SIG_DFL once an in-process Ray has started
    stop = StopController(timeout_s=0.3, hard_exit=exits.append).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.requested and stop.signal_name == "SIGTERM" and exits == []
        time.sleep(0.6)  # the watchdog: past stop_timeout_s the process ends whatever it is doing
        assert exits == [128 + signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGINT)  # a second signal: at once
        time.sleep(0.05)
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
    proc = start_cli(["-m", "hydra/launcher=submitit_local", *overrides, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                     env={"WANDB_MODE": "disabled"})
    run_dir = sweep / "0"
    try:
        deadline = time.monotonic() + 300
        while trained_steps(run_dir) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        jobs = [p for p in descendants(proc.pid) if "submitit.core._submit" in cmdline(p)]
        assert len(jobs) == 1 and trained_steps(run_dir) < 30, "the job should be running"
        os.kill(jobs[0], signal.SIGUSR2)
        assert proc.wait(timeout=400) == 0, proc.stderr_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = "".join(p.read_text() for p in sorted((sweep / ".submitit").rglob("*_log.*")))
    assert "rlharness: stopped by SIGUSR2" in logs and "submitit requeues the job" in logs, logs[-3000:]
    assert "Requeued job" in logs, logs[-3000:]
    stopped_at = int(logs.split("rlharness: stopped by SIGUSR2 at step ")[1].split("/")[0])
    assert f"resumed from {run_dir}/checkpoints/step_{stopped_at:08d}" in RunDir(run_dir).log().read_text()
    assert [r["step"] for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r] == list(range(1, 31))
    assert_nothing_lost_or_duplicated(run_dir, total_steps=30, max_staleness=1)


def descendants(pid: int) -> list[int]:
    """Child processes, recursively (Linux /proc)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for c in children for d in descendants(c)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
