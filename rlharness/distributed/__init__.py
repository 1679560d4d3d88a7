"""Disaggregated mode on Ray: engines and training workers as actors behind local interfaces.

`build_remote_components(conf)` joins (or starts) the run's Ray cluster and returns
`(engine, backend)`: engine actors in one placement group behind a `RemoteEngine` /
`RayEngineRouter` (mode=disagg; else None, the engine is built locally), and the
training side as actors behind a `RemoteBackend` (backend=deepspeed and fsdp2: one actor per
rank; mode=disagg with another backend: one actor hosting it). Both implement the
same async interfaces as local objects, so the trainer and manager do not change.
Weights go from training rank 0 to the engines through the object store, or, when
both sides hold GPUs (or the engine declares `engine.weight_sync=collective`), by
broadcast in a group of their own: the route is chosen here, once (`weight_routes`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from rlharness.config.run import RunConf
from rlharness.config.schema import LocalRayClusterConf
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.distributed.weight_routes import setup_weight_group
from rlharness.distributed.placement_plan import actor_resources, plan_nodes, spread
from rlharness.weights.transfer import OBJECT_STORE, choose_route

log = logging.getLogger(__name__)

# Engine actors Ray restarts after a crash (the proxy re-sends the weights).
ENGINE_MAX_RESTARTS = 3


def build_remote_components(conf: RunConf) -> tuple[Any, Any]:
    from rlharness.cluster import connect_ray

    connect_ray(conf.cluster)
    (engine_cpus, engine_gpus), (trainer_cpus, trainer_gpus) = actor_resources(conf)
    # Multi-node disagg: engines on the last nodes, training actors on the first (placement_plan).
    plan = plan_nodes(conf)
    engine_at = spread(conf.engine.num_engines, plan.engine_nodes) if plan else None
    trainer_at = spread(conf.backend.workers, plan.trainer_nodes) if plan else None
    transfer = (choose_route(conf.engine.weight_sync, engine_gpus, trainer_gpus)
                if conf.mode == "disagg" else OBJECT_STORE)
    if conf.mode == "disagg":
        set_driver_threads(conf, engine_cpus, trainer_cpus)
    engine = backend = None
    try:
        if conf.backend.ranked:
            backend = start_ranked_backend(conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed,
                                           cpus_per_worker=trainer_cpus, timeout_s=conf.timeout_s,
                                           node_ranks=trainer_at)
        elif conf.mode == "disagg":
            backend = start_backend_actor(conf, trainer_cpus, trainer_gpus, node_ranks=trainer_at)
        if conf.mode == "disagg":
            from rlharness.distributed.spawn import spawn_engines

            # A restarted engine cannot rejoin a broadcast group: no restarts there (resume instead).
            engine = spawn_engines(conf.engine, conf.model, conf.seed, cpus=engine_cpus, gpus=engine_gpus,
                                   timeout_s=conf.timeout_s, node_ranks=engine_at,
                                   max_restarts=0 if transfer != OBJECT_STORE else ENGINE_MAX_RESTARTS)
            if transfer != OBJECT_STORE:
                setup_weight_group(backend, engine, transfer, conf.timeout_s)
        if backend is not None and conf.mode == "disagg":
            backend.prefetch_weights = conf.sync_weights_interval == 1
    except BaseException:
        import asyncio

        if engine is not None:
            asyncio.run(engine.close())
        if backend is not None:
            asyncio.run(backend.close())
        raise
    return engine, backend


def set_driver_threads(conf: RunConf, engine_cpus: float, trainer_cpus: float) -> None:
    """The driver runs the producer (Python, little torch): its torch threads get what the actors leave.

    On a small machine the leftover is under one CPU, and OpenMP threads spinning
    against busy actors cost far more than they help (measured: a 2-thread decode
    step 30x slower on 2 busy cores), so the driver uses one thread there.
    """
    import torch

    if isinstance(conf.cluster, LocalRayClusterConf):
        left = conf.cluster.num_cpus - conf.engine.num_engines * engine_cpus - conf.backend.workers * trainer_cpus
        torch.set_num_threads(max(1, int(left)))


def start_backend_actor(conf: RunConf, cpus: float, gpus: float, node_ranks: list[int] | None = None):
    """One training actor hosting the backend `build_backend` makes for `conf.backend`."""
    from rlharness.backend import build_backend
    from rlharness.distributed.train_actor import spawn_train_workers

    def factory(rank: int, addr: str, port: int):
        return functools.partial(build_backend, conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed)

    return spawn_train_workers(factory, 1, cpus, gpus, {}, conf.timeout_s, name=conf.backend.name,
                               node_ranks=node_ranks)


__all__ = ["ENGINE_MAX_RESTARTS", "actor_resources", "build_remote_components", "set_driver_threads",
           "start_backend_actor", "start_ranked_backend"]
