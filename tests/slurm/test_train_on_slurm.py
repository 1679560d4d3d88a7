"""train.py on the local Slurm: one job per sweep point, and a preempted job that is
requeued by submitit and resumes in its own run directory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from rlharness.core.run_dir import RunDir
from tests.helpers import HANG_S, CliProcess, start_cli, wait_until
from rlharness.core.fault_points import signal_at

pytestmark = [pytest.mark.slurm]

# Small and quick: simulated engine and trainer, tiny batches, no W&B.
SMALL = ["engine=sim", "backend=sim", "batch_size=2", "sampler.prompt_repeat_k=2", "eval.num_prompts=8",
         "logger=none", "cluster.cpus_per_task=1", "cluster.mem_gb=2"]


def _train(sweep: Path, *overrides: str, env: dict | None = None) -> CliProcess:
    return start_cli(["-m", "cluster=slurm", *SMALL, *overrides, f"hydra.sweep.dir={sweep}"], cwd=sweep.parent,
                     merge_stderr=True, env=env)


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in RunDir(run_dir).metrics.read_text().splitlines() if line]


def assert_complete_run(run_dir: Path, total_steps: int) -> None:
    """The run-directory contract after a finished run, resumed or not."""
    steps = _steps(run_dir)
    train_steps = [s for s in steps if s > 0]  # step 0: the evaluation before training
    assert train_steps == list(range(1, total_steps + 1)), f"{run_dir}: metrics steps {steps}"
    assert steps == sorted(steps) and len(set(steps)) == len(steps), f"{run_dir}: repeated steps {steps}"
    rollout_files = sorted(p.name for p in RunDir(run_dir).rollouts.glob("step_*.jsonl"))
    assert rollout_files == [f"step_{s:08d}.jsonl" for s in range(1, total_steps + 1)]
    for s in range(1, total_steps + 1):
        rows = [json.loads(x) for x in RunDir(run_dir).rollout(s).read_text().splitlines()]
        assert rows and {r["train_step"] for r in rows} == {s}, f"step {s}: {rows[:1]}"
    assert any((c / "DONE").is_file() for c in RunDir(run_dir).checkpoints.glob("step_*"))
    assert RunDir(run_dir).config.is_file()


def _job_id(run_dir: Path) -> str:
    return str(yaml.safe_load((RunDir(run_dir).hydra / "hydra.yaml").read_text())["hydra"]["job"]["id"])


@pytest.mark.slow
@pytest.mark.timeout(HANG_S + 60)
def test_one_slurm_job_per_point_each_a_complete_run(slurm_env, tmp_path):
    proc = _train(tmp_path / "sweep", "total_steps=5", "seed=1,2")
    out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out
    job_ids = []
    for num in (0, 1):
        run_dir = tmp_path / "sweep" / str(num)
        assert_complete_run(run_dir, 5)
        job_ids.append(_job_id(run_dir))
        assert f"job #{num}: id {job_ids[-1]}, ok" in out  # printed by the sweep summary
    assert len(set(job_ids)) == 2 and all(j.split("_")[0].isdigit() for j in job_ids)


def _slurm(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def _proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict ({} once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _pending(pid: int, sig: int) -> bool:
    """`sig` is pending for the process (sent to it, not yet delivered: it is stopped)."""
    status = _proc_status(pid)
    return any(int(status.get(key, "0"), 16) >> (sig - 1) & 1 for key in ("SigPnd", "ShdPnd"))


def start_requeued_job_soon(job_id: str) -> None:
    """Slurm holds a requeued job back (BeginTime: now + the credential lifetime + 1 s) because its
    new launch credential must be stamped after the node revoked the old one, in whole seconds
    (slurm_cred.c: `ctime <= revoked` is refused). Once the job is pending again (the node has
    cleaned up, so the revocation is in the past), let it start 2 s from now, not now: a launch
    in the revocation's second is killed ("Killing non-startable batch job: Job credential revoked")
    and the job ends FAILED, as a CI run on a loaded machine showed."""
    wait_until(lambda: "JobState=PENDING" in _slurm("scontrol", "show", "job", job_id), "the job pending again")
    _slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now+2")


@pytest.mark.slow
@pytest.mark.timeout(3 * HANG_S)
def test_preempted_job_is_requeued_and_resumes_from_its_checkpoint(slurm_env, tmp_path):
    total = 12
    run_dir = tmp_path / "sweep" / "0"
    # The job stops itself (SIGSTOP) right after its step 5: the preemption signal reaches it there, on
    # any machine (a run left going could end before the signal). Its requeued life resumes past step 5.
    proc = _train(tmp_path / "sweep", f"total_steps={total}", "save_every=2", "eval_every=0", "seed=3",
                  env=signal_at(signal.SIGSTOP, "step_trained", 5))
    try:
        lock = RunDir(run_dir).lock
        wait_until(lambda: lock.is_file() and lock.read_text().strip() and
                   _proc_status(int(lock.read_text())).get("State", "").startswith("T"), "the job to hold at step 5")
        pid = int(lock.read_text())  # the job's process: the nodes share this machine's process ids
        job_id = _job_id(run_dir)
        # What Slurm does on preemption (and before a timeout): SIGUSR2 to the job step.
        # submitit catches it, calls the launcher's checkpoint() and requeues the job.
        _slurm("scancel", "--signal=USR2", job_id)
        wait_until(lambda: _pending(pid, signal.SIGUSR2), "Slurm's SIGUSR2 to reach the job's process")
        os.kill(pid, signal.SIGCONT)  # it goes on from step 5 with the signal to handle
        wait_until(lambda: "Restarts=1" in _slurm("scontrol", "show", "job", job_id), "the requeue")
        start_requeued_job_soon(job_id)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    log = RunDir(run_dir).log().read_text()
    assert "Requeued job" in log  # submitit's own line, from the interrupted attempt
    assert re.search(r"resum\w* from \S*checkpoints/step_00000005", log), "the requeued job did not resume from step 5"
    assert_complete_run(run_dir, total)
