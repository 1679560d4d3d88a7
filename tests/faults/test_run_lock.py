"""One live process per run directory (issue 22, item 3): a second start is refused in one line
naming the PID that holds the directory, exit 2, the directory untouched; the lock dies with its
process (SIGKILL leaves none behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlharness.launch import run_lock
from rlharness.core.checkpoint import latest_checkpoint
from rlharness.core.run_dir import DONE, RunDir
from rlharness.core.fault_points import signal_at
from tests.faults.test_refused_input import SIM
from tests.helpers import ROOT, run_cli, run_in_process, start_cli, wait_until

pytestmark = [pytest.mark.timeout(600)]

# Holds the lock until the test kills it (no duration to outlast).
HOLD = ("import signal, sys; from rlharness.launch import run_lock; run_lock.acquire(sys.argv[1]); print('held', flush=True); "
        "signal.pause()")


def _state(pid: int) -> str:
    """The process's state letter in /proc/<pid>/stat (T: stopped, Z: exited, not yet reaped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_held_directory_is_refused_naming_the_pid_and_a_killed_holder_leaves_no_lock(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(run_lock.RunDirLocked, match=f"in use by PID {holder.pid}"):
            run_lock.acquire(run_dir)
        # A job that never passed through train.py's preflight (a sweep point, a Slurm job) is refused too.
        with pytest.raises(run_lock.RunDirLocked, match=f"PID {holder.pid}"):
            run_in_process(run_dir, [*SIM, "total_steps=1"])
        assert sorted(p.name for p in run_dir.iterdir()) == [RunDir(run_dir).lock.name]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert run_lock.acquire(run_dir)  # SIGKILL: the kernel dropped the lock with the process
    assert RunDir(run_dir).lock.read_text() == f"{os.getpid()}\n"
    assert not run_lock.acquire(run_dir)  # this process holds it already
    run_lock.release(run_dir)


def test_two_real_starts_into_one_directory(tmp_path):
    run_dir = tmp_path / "run"
    # The first run stops itself (SIGSTOP) once its first checkpoint is saved: alive, holding the
    # directory, for as long as the other starts take, however slow the machine; killed below.
    first = start_cli([*SIM, "save_every=1", "total_steps=1000", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                      env=signal_at(signal.SIGSTOP, "checkpoint_saved", 1))
    try:
        wait_until(lambda: _state(first.pid) in "TtZ", "the first run to hold after its first checkpoint")
        assert _state(first.pid) == "T", first.stderr_text()[-3000:]
        assert (RunDir(run_dir).checkpoint(1) / DONE).is_file()
        assert RunDir(run_dir).lock.read_text() == f"{first.pid}\n"
        for args in ([*SIM, f"hydra.run.dir={run_dir}", "total_steps=1000"], [f"resume={run_dir}"]):
            proc = run_cli(args, cwd=tmp_path, check=False)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 2, proc.stderr[-2000:]
            assert lines[-1].startswith("error: ") and f"in use by PID {first.pid}" in lines[-1], lines
            assert "Traceback" not in proc.stderr
            assert not list(RunDir(run_dir).hydra.glob("resumed-*")), "the refused start wrote into the run"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # No stale lock: the next start continues the killed run.
    last = latest_checkpoint(run_dir)[0]
    proc = run_cli([*SIM, f"hydra.run.dir={run_dir}", f"total_steps={last + 1}"], cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "continuing it as resume=" in proc.stderr
    assert latest_checkpoint(run_dir)[0] == last + 1
    assert Path(RunDir(run_dir).lock).read_text().strip() != str(first.pid)
