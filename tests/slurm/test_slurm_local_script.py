"""scripts/slurm_local.sh itself, on a second local Slurm of its own (another directory and
ports, so the session's cluster keeps running): `up` twice, `down` with nothing up, `down`
while a two-node job runs (nothing of the job, no node namespace, no state left), and a
stale pid file whose pid now belongs to another process (left alone)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import HANG_S, wait_until

from .conftest import SCRIPT

pytestmark = [pytest.mark.slurm]


def _script(env: dict, *args: str, timeout_s: float = HANG_S) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout_s)


def _pids_in_namespaces(inodes: set[str]) -> list[int]:
    found = []
    for ns in Path("/proc").glob("[0-9]*/ns/uts"):
        try:
            if os.readlink(ns) in inodes:
                found.append(int(ns.parts[2]))
        except OSError:
            pass
    return found


@pytest.mark.timeout(4 * HANG_S)  # five calls of the script and a job, each bounded by HANG_S
def test_up_twice_down_with_a_job_running_and_down_again(slurm_env, tmp_path):
    # slurm_env first: the session's cluster started munged, so this one's `down` leaves it running.
    base = Path(f"/tmp/rlh-slurm-script-{os.getpid()}")
    env = {**os.environ, "SLURM_LOCAL_DIR": str(base), "SLURM_LOCAL_CTLD_PORT": "7917"}
    env.pop("SLURM_CONF", None)
    slurm = {**env, "SLURM_CONF": str(base / "etc" / "slurm.conf")}
    bystander = subprocess.Popen(["sleep", "600"])  # not ours to stop, whatever a pid file says
    try:
        out = _script(env, "down")
        assert out.returncode == 0 and "down" in out.stderr, out.stderr  # nothing up: nothing to do

        assert _script(env, "up", "--nodes", "0").returncode == 2
        out = _script(env, "up", "--nodes", "2", "--gpus", "1")
        assert out.returncode == 0, out.stderr
        run = base / "run"
        slurmd = {f.name: f.read_text().strip() for f in run.glob("slurmd-*.pid")}
        assert sorted(slurmd) == ["slurmd-rlh-node1.pid", "slurmd-rlh-node2.pid"]
        out = _script(env, "up", "--nodes", "2", "--gpus", "1")
        assert out.returncode == 0 and "already up" in out.stderr, out.stderr
        assert {f.name: f.read_text().strip() for f in run.glob("slurmd-*.pid")} == slurmd  # same daemons

        job = subprocess.run(["sbatch", "--parsable", "-N", "2", "--gpus-per-node=1", "-c", "1",
                              f"--output={tmp_path / 'job.out'}", "--wrap", "srun sleep 611"],
                             capture_output=True, text=True, env=slurm, timeout=HANG_S)
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip().split(";")[0]
        shown = ""

        def running() -> bool:
            nonlocal shown
            shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=slurm).stdout
            return "JobState=RUNNING" in shown

        wait_until(running, "the job to run", poll_s=0.5)
        assert re.search(r"TresPerNode=\S*gpu:1", shown), shown
        namespaces = {os.readlink(f"/proc/{pid}/ns/uts") for pid in slurmd.values()}
        assert len(namespaces) == 2 and os.readlink("/proc/self/ns/uts") not in namespaces
        # The job's steps, beside the two slurmd.
        wait_until(lambda: len(_pids_in_namespaces(namespaces)) > 2, "the job's processes in the nodes' namespaces",
                   poll_s=0.5)
        (run / "slurmd-rlh-node9.pid").write_text(f"{bystander.pid}\n")  # stale: the pid is another process

        out = _script(env, "down")
        assert out.returncode == 0, out.stderr
        assert not base.exists()
        assert _pids_in_namespaces(namespaces) == [], "processes left in the nodes' namespaces"
        left = subprocess.run(["pgrep", "-f", "sleep 611"], capture_output=True, text=True).stdout
        assert not left.strip(), f"the job's processes outlived down: {left}"
        assert bystander.poll() is None, "down stopped a process a stale pid file named"
        out = _script(env, "down")
        assert out.returncode == 0, out.stderr
    finally:
        bystander.kill()
        if base.exists():
            _script(env, "down")
