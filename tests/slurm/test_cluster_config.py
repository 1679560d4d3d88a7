"""conf/cluster/slurm.yaml composes into hydra-submitit-launcher's settings (no Slurm needed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlharness.config.schema import ConfigError, SlurmClusterConf
from rlharness.config.store import register_configs
from tests.helpers import HANG_S

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_cluster_slurm_selects_and_fills_the_submitit_launcher():
    cfg = _compose(["cluster=slurm", "cluster.partition=gpu", "cluster.nodes=2", "cluster.gpus_per_node=4",
                    "cluster.mem_gb=64", "cluster.timeout_min=90", 'cluster.setup=["module load cuda"]'])
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    # submitit polls the jobs through a watcher that waits out a requeue (installed by a callback)
    assert cfg.hydra.callbacks.requeue_aware_watcher._target_ == "rlharness.launch.submitit_requeue.RequeueAwareWatching"
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "submitit_slurm"
    assert {k: launcher[k] for k in ("partition", "nodes", "gpus_per_node", "mem_gb", "timeout_min",
                                     "cpus_per_task", "max_num_timeout", "setup")} == {
        "partition": "gpu", "nodes": 2, "gpus_per_node": 4, "mem_gb": 64, "timeout_min": 90,
        "cpus_per_task": SlurmClusterConf.cpus_per_task, "max_num_timeout": SlurmClusterConf.max_num_timeout,
        "setup": ["module load cuda"]}
    # Unset keys stay real nulls (submitit omits them), never the string "None".
    assert launcher["account"] is None and launcher["qos"] is None and launcher["constraint"] is None
    assert cfg.cluster.name == "slurm"


def test_other_clusters_keep_the_basic_launcher():
    for cluster in ("local", "local_ray"):
        cfg = _compose([f"cluster={cluster}"])
        assert cfg.hydra.runtime.choices["hydra/launcher"] == "basic", cluster


@pytest.mark.timeout(60)
def test_connect_ray_slurm_outside_a_job_says_so(monkeypatch):
    from rlharness.cluster import connect_ray

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        connect_ray(SlurmClusterConf())


PROBE = """
import ray
from rlharness.config.schema import LocalRayClusterConf
from rlharness.cluster import connect_ray
connect_ray(LocalRayClusterConf(num_cpus=1, object_store_memory_mb=100, temp_dir={temp!r}))
print("CPUS", ray.cluster_resources()["CPU"], "VALUE", ray.get(ray.put(41)) + 1)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(HANG_S + 60)
def test_connect_ray_local_ray_starts_a_local_cluster():
    # In a subprocess: other tests may hold their own Ray session in this process.
    # A short temp dir: Ray's unix socket paths must stay under 107 bytes.
    temp = tempfile.mkdtemp(prefix="rlh-ray-test-", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(temp=temp)], capture_output=True, text=True,
                         timeout=HANG_S, env=env)
    assert out.returncode == 0, out.stderr
    assert "CPUS 1.0 VALUE 42" in out.stdout
    assert any(Path(temp).glob("session_*"))  # session files went where configured
    shutil.rmtree(temp, ignore_errors=True)


SINFO = """debug*|rlh-node1|2|gpu:2
debug*|rlh-node2|2|gpu:2
big|a1|64|gpu:a100:8(S:0-1)
big|a2|64|gpu:a100:4,gpu:v100:2
big|a3|32|(null)
"""


def test_gres_gpu_counts_as_sinfo_prints_them():
    from rlharness.launch.slurm_capacity import gres_gpus

    assert [gres_gpus(g) for g in ("gpu:2", "gpu:a100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "(null)", "")] == \
        [2, 8, 6, 0, 0]


@pytest.mark.parametrize("overrides, message", [
    ({"nodes": 3}, r"cluster.nodes=3 is not allowed: at most 2 node\(s\) .* in Slurm partition 'debug', whose "
                   r"nodes are rlh-node1 \(2 CPUs, 2 GPUs\), rlh-node2"),
    ({"nodes": 2, "gpus_per_node": 3}, r"cluster.gpus_per_node=3 is not allowed: at most 2 in Slurm partition 'debug'"),
    ({"nodes": 1, "cpus_per_task": 4}, r"cluster.cpus_per_task=4 is not allowed: at most 2 in"),
    ({"partition": "nope"}, r"cluster.partition='nope' is not allowed: this Slurm's partitions are big, debug"),
    ({"partition": "big", "nodes": 3, "gpus_per_node": 6}, r"cluster.nodes=3 is not allowed: at most 2 node\(s\) "
                                                           r"with cluster.gpus_per_node=6"),
])
def test_requests_the_partition_can_never_hold_are_refused_naming_the_key(overrides, message):
    from rlharness.launch.slurm_capacity import parse_sinfo, refusal

    reason = refusal(*parse_sinfo(SINFO), SlurmClusterConf(**{"cpus_per_task": 1, **overrides}))
    assert reason is not None and re.search(message, reason), reason


def test_requests_that_fit_pass():
    from rlharness.launch.slurm_capacity import parse_sinfo, refusal

    for conf in (SlurmClusterConf(nodes=2, gpus_per_node=2), SlurmClusterConf(partition="big", nodes=2, gpus_per_node=6,
                                                                             cpus_per_task=64),
                 SlurmClusterConf(partition="big", nodes=3, cpus_per_task=32)):
        assert refusal(*parse_sinfo(SINFO), conf) is None, conf


def test_a_job_whose_node_0_left_no_result_reports_what_the_other_nodes_said(tmp_path):
    import pickle

    from hydra.core.utils import JobReturn, JobStatus

    from rlharness.launch.job_errors import other_tasks_errors

    folder = tmp_path / ".submitit" / "12"
    folder.mkdir(parents=True)
    failed = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("the Ray head on node n1 went away"))
    (folder / "12_1_result.pkl").write_bytes(pickle.dumps(("success", failed)))
    (folder / "12_2_result.pkl").write_bytes(pickle.dumps(("success", {"ray_worker_node": 2})))
    (folder / "12_3_result.pkl").write_bytes(pickle.dumps(("error", "Traceback ...\nValueError: bad")))
    exc = RuntimeError(f"Job 12 (task: 0) with path {folder / '12_0_result.pkl'}\nhas not produced any output")
    assert other_tasks_errors(exc) == ["task 1: RuntimeError: the Ray head on node n1 went away",
                                       "task 3: ValueError: bad"]
    assert other_tasks_errors(RuntimeError("something else")) == []
    assert other_tasks_errors(None) == []
