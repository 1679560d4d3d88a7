"""Which Slurm node hosts which actor (rlharness/distributed/placement_plan.py), checked before anything starts."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError
from rlharness.distributed.placement_plan import NodePlan, actor_resources, plan_nodes, spread
from rlharness.launch.preflight import check_placement
from tests.helpers import compose_conf

SLURM = ["cluster=slurm", "mode=disagg"]


def _plan(*overrides: str):
    conf, _ = compose_conf([*SLURM, *overrides])
    return plan_nodes(conf)


def test_one_node_pins_nothing_and_colocate_pins_nothing():
    assert _plan("cluster.nodes=1") is None
    conf, _ = compose_conf(["cluster=slurm", "cluster.nodes=2", "mode=colocate", "backend=deepspeed"])
    assert plan_nodes(conf) is None
    with pytest.raises(ConfigError, match="cluster.nodes=2 with mode=colocate and backend=torch is not allowed"):
        compose_conf(["cluster=slurm", "cluster.nodes=2", "mode=colocate"])  # one process: node 1 would idle


def test_two_cpu_nodes_put_engines_on_the_last_and_training_on_node_0():
    assert _plan("cluster.nodes=2") == NodePlan(engine_nodes=(1,), trainer_nodes=(0,))


def test_auto_engine_nodes_follow_the_engines_gpus():
    # 12 engines x 1 GPU on 8-GPU nodes: 2 engine nodes; the other 2 train.
    plan = _plan("cluster.nodes=4", "cluster.gpus_per_node=8", "cluster.cpus_per_task=16", "engine.device=cuda",
                 "engine.num_engines=12", "backend.device=cuda")
    assert plan == NodePlan(engine_nodes=(2, 3), trainer_nodes=(0, 1))
    # Never all nodes: one stays for training.
    plan = _plan("cluster.nodes=2", "cluster.gpus_per_node=8", "cluster.cpus_per_task=16", "engine.device=cuda",
                 "engine.num_engines=8")
    assert plan == NodePlan(engine_nodes=(1,), trainer_nodes=(0,))


def test_explicit_engine_nodes():
    assert _plan("cluster.nodes=3", "cluster.engine_nodes=2") == NodePlan(engine_nodes=(1, 2), trainer_nodes=(0,))


def test_spread_keeps_consecutive_ranks_together():
    assert spread(4, (2, 3)) == [2, 2, 3, 3]
    assert spread(3, (0, 1)) == [0, 0, 1]
    assert spread(1, (5,)) == [5]


def test_slurm_actor_cpus_come_from_the_cluster_config():
    conf, _ = compose_conf([*SLURM, "cluster.engine_cpus=0.5", "cluster.trainer_cpus=0.25"])
    assert actor_resources(conf) == ((0.5, 0.0), (0.25, 0.0))


@pytest.mark.parametrize("overrides,message", [
    (["cluster.nodes=2", "cluster.engine_nodes=2"], "cluster.engine_nodes=2 is not allowed"),
    (["cluster.nodes=1", "cluster.engine_nodes=1"], "cluster.engine_nodes=1 is not allowed"),
    (["cluster.engine_cpus=0"], "cluster.engine_cpus=0.0 is not allowed"),
    # Two engines of 1 CPU on the one engine node, which has cpus_per_task=1.
    (["cluster.nodes=2", "cluster.cpus_per_task=1", "engine.num_engines=2"],
     r"2 engine\(s\) .* on Slurm node 1 of cluster.nodes=2 .*: 2 CPUs, but cluster.cpus_per_task=1"),
    # A CUDA engine on nodes that have no GPUs.
    (["cluster.nodes=2", "engine.device=cuda"], r"on Slurm node 1 .*: 1 GPUs, but cluster.gpus_per_node=0"),
])
def test_plans_that_cannot_fit_are_refused_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_placement(compose_conf([*SLURM, *overrides])[0])  # train.py's preflight asks both
