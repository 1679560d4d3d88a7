"""Placement groups and actor options: engines in one group, training workers in another."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlharness.cluster.ray_cluster import node_resource

log = logging.getLogger(__name__)


def make_placement_group(name: str, count: int, cpus: float, gpus: float, timeout_s: float,
                         node_ranks: list[int] | None = None) -> Any:
    """`count` bundles of {CPU: cpus, GPU: gpus}, packed; fails clearly if the cluster cannot hold them.

    `node_ranks[i]` pins bundle i to that Slurm node (its `rlh_node_<rank>` resource).
    """
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    bundles = [dict(bundle) for _ in range(count)]
    for b, rank in zip(bundles, node_ranks or []):
        b[node_resource(rank)] = 1.0
    pg = placement_group(bundles, strategy="PACK", name=name)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"placement group {name!r} ({bundles}) could not be placed within "
                           f"{timeout_s:g} s; the cluster has {ray.available_resources()} available")
    return pg


def node_info() -> dict[str, str]:
    """Where the calling actor runs: hostname, Ray node address and id (actors report it)."""
    import socket

    ctx = ray.get_runtime_context()
    return {"hostname": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id()}


def describe_node(node_id: str) -> tuple[str, bool]:
    """("<hostname> (<ip>)", alive) of a Ray node, from the cluster's node table."""
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')})", node["Alive"]
    return f"node {node_id[:12]}", False


def threads_for(cpus: float) -> int:
    """torch threads for an actor holding `cpus` logical CPUs: a fraction still needs one thread,
    and 1.5 CPUs may use two cores while its neighbour idles."""
    return max(1, math.ceil(cpus - 1e-9))


def thread_env(cpus: float) -> dict[str, str]:
    """Environment for an actor's process. OpenMP threads that spin while waiting for a
    descheduled sibling make a parallel op many times slower when cores are shared
    (measured on 2 cores next to busy processes: a tiny-model train step took 0.19 s
    with 1 thread, 1.2 s with 2 spinning threads, 0.24 s with 2 passive ones), so
    actors that may share cores wait passively."""
    return {"OMP_NUM_THREADS": str(threads_for(cpus)), "OMP_WAIT_POLICY": "PASSIVE"}


def in_bundle(pg: Any, index: int) -> dict[str, Any]:
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index)}


def wait_all(refs: list[Any], names: list[str], what: str, timeout_s: float) -> list[Any]:
    """ray.get for several calls that must all succeed; the first failure is raised at once, named."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
        if not ready:
            late = [n for r, n in zip(refs, names) if r in pending]
            raise TimeoutError(f"{what}: {late} did not finish within {timeout_s:g} s")
        try:
            ray.get(ready[0])
        except Exception as exc:
            raise RuntimeError(f"{what}: {names[refs.index(ready[0])]} failed: {exc}") from exc
    return ray.get(refs)


def start_side_actor(cls: type, name: str, num_cpus: float, device: str, torch_threads: int, timeout_s: float,
                     *args: Any) -> tuple[Any, Any]:
    """A model beside the run (a reward model, a distillation teacher) as a Ray actor `cls(*args)`: a
    placement group of its own where it reserves CPUs or a GPU (one GPU when `device` is cuda), torch
    threads set in its environment, no restarts; returns (actor, placement group or None) once it is ready."""
    import ray

    gpus = 1.0 if device.startswith("cuda") else 0.0
    placement_group = None
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": gpus, "max_restarts": 0,
                               "runtime_env": {"env_vars": thread_env(torch_threads)}}
    if num_cpus or gpus:
        placement_group = make_placement_group(name, 1, num_cpus, gpus, timeout_s)
        options.update(in_bundle(placement_group, 0))
    actor = ray.remote(cls).options(**options).remote(*args)
    ray.get(actor.ready.remote(), timeout=timeout_s)
    return actor, placement_group


def stop_side_actor(actor: Any, placement_group: Any) -> None:
    import ray

    ray.kill(actor, no_restart=True)
    if placement_group is not None:
        ray.util.remove_placement_group(placement_group)
