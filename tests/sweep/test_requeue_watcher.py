"""A job that reads FAILED while Slurm requeues it is waited for, not reported as failed (no Slurm needed:
the job states come from a real `sacct`-shaped command the test scripts). Time is a clock the tests
move (the watcher's and submitit's), not the machine's: the grace runs out exactly when told."""

from __future__ import annotations

import sys

import pytest

import rlharness.launch.submitit_requeue as submitit_requeue
from rlharness.launch.submitit_requeue import RequeueAwareWatcher


class Clock:
    """time.time and time.monotonic for the watcher and submitit, moved only by `advance`."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    monotonic = time

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> Clock:
    import submitit.core.core as submitit_core

    c = Clock()
    monkeypatch.setattr(submitit_requeue, "time", c)
    monkeypatch.setattr(submitit_core, "_time", c)
    return c

SACCT = """import sys
state = open(sys.argv[1]).read().strip()
if state == "NO ANSWER":
    sys.exit("slurm_load_jobs error: Socket timed out on send/recv operation")
print("JobID|State|NodeList")
if state != "PURGED":  # a finished job Slurm no longer lists: the poll answers without it
    print(f"42|{state}|rlh-node1")
"""


class ScriptedWatcher(RequeueAwareWatcher):
    """Reads job 42's state from a file through a sacct-shaped script (what scripts/sacct_shim answers)."""

    def __init__(self, tmp_path, grace_s: float):
        super().__init__(delay_s=0, grace_s=grace_s)
        self.state_file = tmp_path / "state"
        script = tmp_path / "sacct.py"
        script.write_text(SACCT)
        self.command = [sys.executable, str(script), str(self.state_file)]
        self.register_job("42")

    def _make_command(self):
        return self.command

    def set(self, state: str) -> None:
        self.state_file.write_text(state)
        self.update()


def test_a_failed_reading_during_a_requeue_is_not_the_end(tmp_path):
    w = ScriptedWatcher(tmp_path, grace_s=30.0)
    w.set("RUNNING")
    assert not w.is_done("42", mode="cache")
    w.set("FAILED")  # the attempt that was preempted, before Slurm shows it queued again
    assert not w.is_done("42", mode="cache") and "42" not in w._finished
    w.set("PENDING")
    assert not w.is_done("42", mode="cache")
    w.set("COMPLETED")
    assert w.is_done("42", mode="cache")


def test_a_failure_that_stays_ends_the_wait_after_the_grace_period(tmp_path, clock):
    w = ScriptedWatcher(tmp_path, grace_s=0.5)
    w.set("FAILED")
    assert not w.is_done("42", mode="cache")
    clock.advance(0.4)
    w.set("FAILED")  # read again within the grace
    assert not w.is_done("42", mode="cache")
    clock.advance(0.2)
    w.set("FAILED")  # read again past the grace
    assert w.is_done("42", mode="cache")
    w.set("CANCELLED by 0")  # a cancel is final at once
    w._suspect_since.clear()
    assert w.is_done("42", mode="cache")


def test_the_grace_runs_only_over_readings_that_answered(tmp_path, clock):
    """A busy controller: the polls after the FAILED reading fail, so the cached FAILED is stale and
    must not end the wait however long the controller stays silent (the CI failure of stop 31)."""
    w = ScriptedWatcher(tmp_path, grace_s=0.5)
    w.set("FAILED")
    w.set("NO ANSWER")
    clock.advance(600)
    w.set("NO ANSWER")
    assert not w.is_done("42", mode="cache") and "42" not in w._finished
    w.set("PENDING")  # the controller answers again: the job was requeued all along
    assert not w.is_done("42", mode="cache")
    w.set("FAILED")
    clock.advance(0.6)
    w.set("FAILED")  # read again, answered, past the grace: final
    assert w.is_done("42", mode="cache")


def test_a_failed_job_that_slurm_purges_still_ends_the_wait(tmp_path, clock):
    """After MinJobAge the shim answers without the job: an answered poll, so the grace still runs out."""
    w = ScriptedWatcher(tmp_path, grace_s=0.5)
    w.set("FAILED")
    w.set("PURGED")
    clock.advance(0.6)
    w.set("PURGED")
    assert w.is_done("42", mode="cache")


def test_a_suspect_failure_is_read_again_soon_whatever_submitits_polling_delay(tmp_path, clock):
    """submitit's polls thin out as a job ages (every 150 s for a 5-minute-old job, up to
    delay_s=600): a failure read then must be read again within seconds, or the grace runs
    out only minutes late and Slurm may have purged the job meanwhile (CI, stop 32: the
    sweep reported a job that failed at 22:56:57 only at 23:02:21)."""
    w = ScriptedWatcher(tmp_path, grace_s=0.5)
    w._delay_s = 600
    w.set("FAILED")
    w._start_time = clock.time() - 1000  # an old job: submitit's own next poll is 500 s away
    polls = w.num_calls
    waited = 0.0
    while not w.is_done("42", mode="standard"):  # what submitit's Job.wait calls, once a second
        assert waited < 10, "the failure was not read again within 10 s"
        clock.advance(1.0)
        waited += 1.0
    assert w.num_calls == polls + 1  # read again once, by the watcher, not by submitit's schedule
    assert "FAILED" in w._history["42"]


@pytest.mark.parametrize("state", ["FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"])
def test_submitits_own_watcher_would_have_ended_the_wait(tmp_path, state):
    """What the sweep hit: submitit takes any of these as final at the first reading."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    w = ScriptedWatcher(tmp_path, grace_s=30.0)
    w.set(state)
    assert SlurmInfoWatcher.is_done(w, "42", mode="cache")
    assert not w.is_done("42", mode="cache")


def test_cluster_slurm_installs_the_watcher_for_the_sweep():
    from omegaconf import OmegaConf
    from submitit.slurm import slurm as submitit_slurm

    from rlharness.launch.submitit_requeue import RequeueAwareWatching

    before = submitit_slurm.SlurmJob.watcher
    try:
        RequeueAwareWatching().on_multirun_start(OmegaConf.create({"cluster": {"requeue_grace_s": 7}}))
        watcher = submitit_slurm.SlurmJob.watcher
        assert isinstance(watcher, RequeueAwareWatcher) and watcher.grace_s == 7.0
    finally:
        submitit_slurm.SlurmJob.watcher = before
