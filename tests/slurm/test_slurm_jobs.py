"""Real jobs on the local Slurm (scripts/slurm_local.sh): submitit, a Hydra multirun through
conf/cluster/slurm.yaml, a refused partition, and Ray started inside a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from rlharness.core.run_dir import RunDir
from tests.helpers import HANG_S, run_cli, wait_until

pytestmark = [pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("hydra_app.py")
JOB_TIMEOUT_S = HANG_S  # a sweep of two jobs: only a hang reaches it

# Functions below run inside Slurm jobs; ship them by value (tests/ is not installed).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _add(a: int, b: int) -> int:
    return a + b


def _fail() -> None:
    raise ValueError("this job fails on purpose")


def _ray_probe(n: int) -> dict:
    import ray

    from rlharness.config.schema import SlurmClusterConf
    from rlharness.cluster import connect_ray

    connect_ray(SlurmClusterConf(cpus_per_task=1, ray_timeout_s=HANG_S))

    @ray.remote(num_cpus=1)
    def square(x: int) -> int:
        return x * x

    return {"sum": sum(ray.get([square.remote(i) for i in range(n)])),
            "nodes": sum(1 for node in ray.nodes() if node["Alive"]),
            "gcs": ray.get_runtime_context().gcs_address,
            "job": os.environ["SLURM_JOB_ID"]}


def _wait_until_finished(job) -> None:
    wait_until(lambda: job.get_info(mode="force").get("State") in ("COMPLETED", "FAILED", "CANCELLED"),
               f"job {job.job_id} to finish", poll_s=0.5)


def _executor(folder: Path, **params):
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(timeout_min=int(HANG_S // 60), cpus_per_task=1, mem_gb=1, slurm_additional_parameters={}, **params)
    return executor


@pytest.mark.timeout(2 * HANG_S)
def test_submitit_jobs_complete_and_fail_with_states(slurm_env, tmp_path):
    executor = _executor(tmp_path / "submitit")
    ok = executor.submit(_add, 2, 3)
    jobs = executor.map_array(_add, [1, 2], [10, 20])
    bad = executor.submit(_fail)
    assert ok.result() == 5
    assert [j.result() for j in jobs] == [11, 22]
    with pytest.raises(Exception, match="this job fails on purpose"):
        bad.result()
    # The sacct shim answers submitit's state queries (no accounting daemon here). A result
    # can be read while Slurm still lists the job as RUNNING (epilog): wait for its end state.
    assert _settled_state(ok) == "COMPLETED"
    assert _settled_state(bad) == "FAILED"


def _settled_state(job) -> str:
    states: list[str] = []
    wait_until(lambda: states.append(job.watcher.get_state(job.job_id, mode="force")) or
               states[-1] not in ("PENDING", "RUNNING", "COMPLETING", "UNKNOWN"), f"job {job.job_id} to settle", poll_s=0.5)
    return states[-1]


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_multirun_cluster_slurm_runs_one_job_per_point(slurm_env, tmp_path):
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [sys.executable, str(APP), "-m", "cluster=slurm", "cluster.mem_gb=1", "cluster.cpus_per_task=1",
         'cluster.setup=["export RLH_SETUP_MARK=yes"]', "seed=1,2", f"hydra.sweep.dir={sweep}"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    seen = [json.loads((sweep / str(i) / "seen.json").read_text()) for i in (0, 1)]
    assert [s["seed"] for s in seen] == [1, 2]
    assert all(s["SLURM_JOB_ID"] for s in seen), seen
    assert len({s["SLURM_JOB_ID"] for s in seen}) == 2
    assert [s["SLURM_CPUS_PER_TASK"] for s in seen] == ["1", "1"]  # cluster.cpus_per_task reached sbatch
    assert [s["RLH_SETUP_MARK"] for s in seen] == ["yes", "yes"]  # cluster.setup ran before the job
    # The sweep summary names each job's Slurm id.
    for i in (0, 1):
        job_id = _hydra_job_id(sweep / str(i))
        assert job_id in out.stdout + out.stderr


def _hydra_job_id(job_dir: Path) -> str:
    import yaml

    return str(yaml.safe_load((RunDir(job_dir).hydra / "hydra.yaml").read_text())["hydra"]["job"]["id"])


@pytest.mark.timeout(HANG_S + 60)
def test_refused_partition_names_it(slurm_env, tmp_path):
    out = subprocess.run(
        [sys.executable, str(APP), "-m", "cluster=slurm", "cluster.partition=no_such_partition", "seed=1",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    assert out.returncode != 0
    assert "invalid partition specified: no_such_partition" in out.stderr


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(2 * HANG_S + 60)
def test_ray_head_started_inside_a_slurm_job(slurm_env, tmp_path):
    job = _executor(tmp_path / "submitit").submit(_ray_probe, 4)
    result = job.result()
    assert result["sum"] == 0 + 1 + 4 + 9
    assert result["nodes"] == 1
    from rlharness.cluster.ray_cluster import derive_port

    assert result["gcs"].endswith(f":{derive_port(result['job'], 0)}")
    # The head's daemons are stopped when the job process exits (after it returned its result).
    _wait_until_finished(job)
    left = subprocess.run(["pgrep", "-f", f"rlh-ray-{result['job']}-"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"Ray processes of job {result['job']} still running: {left.stdout}"


@pytest.mark.timeout(2 * HANG_S + 60)
def test_requests_larger_than_the_partition_are_refused_before_submitting(slurm_env, tmp_path):
    """More nodes than the partition has would pend forever, more GPUs per node fail in sbatch:
    both are one line naming the key, nothing submitted, no sweep directory."""
    before = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split()
    for i, (override, message) in enumerate((("cluster.nodes=3", "cluster.nodes=3 is not allowed: at most 2 node(s)"),
                              ("cluster.gpus_per_node=3", "cluster.gpus_per_node=3 is not allowed: at most 2 in "
                                                          "Slurm partition 'debug', whose nodes are rlh-node1"))):
        sweep = tmp_path / f"sweep{i}"
        out = run_cli(["-m", "cluster=slurm", "cluster.nodes=2", "mode=disagg", "logger=none", override,
                       f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False)
        assert out.returncode == 2, out.stderr[-3000:]
        assert out.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), out.stderr[-3000:]
        assert not sweep.exists()
    after = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(after) <= set(before)  # nothing was submitted
