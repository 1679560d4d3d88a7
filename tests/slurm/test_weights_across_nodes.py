"""The weight broadcast group (rlharness.weights.transfer) between two Slurm nodes:
training rank 0 pinned to node 1, an engine actor pinned to node 2, inside one two-node
Slurm job whose Ray spans both (rlharness.cluster.connect_ray).

On GPU nodes the group is NCCL (`gpu` test; it cannot run on this machine). Its CPU twin,
gloo, is the same code path (rendezvous at rank 0's node address, specs through the
store, bucketed broadcast) and runs here across the local Slurm's two nodes: each side
reports its node, and the engine holds the trainer's exact tensors for every version.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from rlharness.distributed.engine_actor import EngineActor
from tests.helpers import HANG_S

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.slow]

JOB_TIMEOUT_S = HANG_S  # two Ray nodes starting on a busy 2-core box take minutes


class RecordingEngineActor(EngineActor):
    """A real engine actor that also keeps the last state dict its engine loaded (and on which device)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        load = self.engine.load_weights

        async def recording_load(state, version):
            self.last_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            self.last_devices = sorted({v.device.type for v in state.values()})
            return await load(state, version)

        self.engine.load_weights = recording_load

    def last_loaded(self):
        return self.last_state, self.last_devices


# Functions and classes below run inside Slurm jobs and Ray actors: ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _broadcast_between_nodes(model_dir: str, backend_name: str, gpus: int) -> dict:
    """Node 0: Ray head, trainer on node 0, engine on node 1, `versions` broadcasts. Node 1: serves Ray."""
    import asyncio

    from rlharness.backend.learner import Learner
    from rlharness.config.schema import AlgoConf, ModelConf, SimEngineConf, SlurmClusterConf, TorchBackendConf
    from rlharness.distributed.weight_channel import build_weight_channel
    from rlharness.distributed.spawn import spawn_engines
    from rlharness.distributed.train_actor import spawn_train_workers
    from rlharness.cluster import connect_ray
    from rlharness.cluster.ray_cluster import serve_worker_node

    rank = int(os.environ["SLURM_NODEID"])
    if gpus:
        # The local Slurm's nodes share one machine's GPUs: give each node its own device.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    cluster = SlurmClusterConf(nodes=2, cpus_per_task=1, gpus_per_node=gpus, object_store_memory_mb=200,
                               ray_timeout_s=JOB_TIMEOUT_S - 60)
    if rank != 0:
        return serve_worker_node(cluster, run_uses_ray=True)
    connect_ray(cluster)
    device = "cuda" if gpus else "cpu"
    factory = lambda r, a, p: functools.partial(  # noqa: E731
        Learner, TorchBackendConf(device=device), ModelConf(path=model_dir), AlgoConf(name="grpo"), 10, 0)
    trainer = spawn_train_workers(factory, 1, 0.5, gpus and 1, {}, HANG_S, name="xnode", node_ranks=[0])
    engine = spawn_engines(SimEngineConf(num_engines=1, mean_response_len=4, slots=4), ModelConf(path=model_dir),
                           seed=0, cpus=0.5, gpus=gpus and 1, timeout_s=HANG_S, actor_cls=RecordingEngineActor,
                           name="xnode-engine", node_ranks=[1])

    async def main() -> dict:
        try:
            expected = dict(await trainer.get_weights())  # through the object store: the reference copy
            channel = build_weight_channel(trainer, engine, backend_name, timeout_s=HANG_S)
            exact = []
            for version in (1, 2):
                await channel.sync(version)
                got, devices = await engine.actor.last_loaded.remote()
                exact.append(list(got) == list(expected) and all(
                    got[k].dtype == v.dtype and torch.equal(got[k], v.cpu()) for k, v in expected.items()))
            info = await engine.info()
            return {"trainer_node": trainer.nodes[0], "engine_node": engine.node, "exact": exact,
                    "versions": info["versions_loaded"], "engine_devices": devices,
                    "group": channel.route, "tensors": len(expected)}
        finally:
            await engine.close()
            await trainer.close()

    return asyncio.run(main())


def _run_job(tmp_path: Path, model_dir: str, backend_name: str, gpus: int) -> dict:
    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=int(2 * HANG_S // 60), nodes=2, tasks_per_node=1, cpus_per_task=1, mem_gb=2,
                               slurm_additional_parameters={}, **({"gpus_per_node": gpus} if gpus else {}))
    job = executor.submit(_broadcast_between_nodes, model_dir, backend_name, gpus)
    results = job.results()
    assert results[1] == {"ray_worker_node": 1}, results  # node 2 served Ray, then ended cleanly
    return results[0]


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)  # the job's own Slurm limit, and the submitter
def test_gloo_weight_group_across_two_slurm_nodes(slurm_env, tiny_model_dir, tmp_path):
    out = _run_job(tmp_path, tiny_model_dir, "gloo", gpus=0)
    assert (out["trainer_node"]["hostname"], out["trainer_node"]["ip"]) == ("rlh-node1", "127.0.0.2"), out
    assert (out["engine_node"]["hostname"], out["engine_node"]["ip"]) == ("rlh-node2", "127.0.0.3"), out
    assert out["group"] == "gloo" and out["tensors"] > 0
    assert out["exact"] == [True, True], out
    assert out["versions"] == [1, 2]


@pytest.mark.gpu
@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)  # the job's own Slurm limit, and the submitter
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the NCCL weight group across two nodes needs 2 CUDA devices (one per Slurm node: the "
                           "training actor on node 1, the engine on node 2); the gloo twin runs without them")
def test_nccl_weight_group_across_two_slurm_nodes(slurm_env, tiny_model_dir, tmp_path):
    out = _run_job(tmp_path, tiny_model_dir, "nccl", gpus=1)
    assert out["trainer_node"]["hostname"] == "rlh-node1" and out["engine_node"]["hostname"] == "rlh-node2", out
    assert out["group"] == "nccl" and out["engine_devices"] == ["cuda"], out
    assert out["exact"] == [True, True], out
    assert out["versions"] == [1, 2]
