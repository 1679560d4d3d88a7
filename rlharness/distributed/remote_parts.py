"""The parts of a run that live on Ray actors, started once when the run is built.

`start_remote_parts(conf)` joins (or starts) the run's Ray cluster and returns the engine
actors behind a `RemoteEngine` / `RayEngineRouter` (mode=disagg; else None, the engine is
built locally), the training side as actors behind a `RemoteBackend` (backend=deepspeed and
fsdp2: one actor per rank; mode=disagg with another backend: one actor hosting it), and the route
weights take between them (`weight_channel.choose_route`), from which the run's weight
channel is built. Both proxies implement the same async interfaces as local objects, so the
trainer and manager do not change.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from rlharness.config.run import RunConf
from rlharness.config.schema import LocalRayClusterConf
from rlharness.distributed.placement_plan import actor_resources, plan_nodes, spread
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.distributed.weight_channel import IN_PROCESS, OBJECT_STORE, choose_route

log = logging.getLogger(__name__)

# Engine actors Ray restarts after a crash (the proxy re-sends the weights).
ENGINE_MAX_RESTARTS = 3


@dataclass
class RemoteParts:
    """The parts of a run that live on Ray actors (None where a part is local), and the weight
    route between them (`weight_channel.choose_route`; in process when the engine is local)."""

    engine: Any
    backend: Any
    weight_route: str


def start_remote_parts(conf: RunConf) -> RemoteParts:
    """Join (or start) the run's Ray cluster and start its actors: engine actors behind a
    `RemoteEngine`/`RayEngineRouter` (mode=disagg), training actors behind a `RemoteBackend`
    (backend=deepspeed, fsdp2: one per rank; mode=disagg with another backend: one hosting it)."""
    from rlharness.cluster import connect_ray

    connect_ray(conf.cluster)
    (engine_cpus, engine_gpus), (trainer_cpus, trainer_gpus) = actor_resources(conf)
    # Multi-node disagg: engines on the last nodes, training actors on the first (placement_plan).
    plan = plan_nodes(conf)
    engine_at = spread(conf.engine.num_engines, plan.engine_nodes) if plan else None
    trainer_at = spread(conf.backend.workers, plan.trainer_nodes) if plan else None
    route = (choose_route(conf.engine.weight_sync, engine_gpus, trainer_gpus)
             if conf.mode == "disagg" else IN_PROCESS)
    # The object store route copies a version into the store right after its step, while production
    # runs, when every step syncs (RemoteBackend).
    put_after_step = route == OBJECT_STORE and conf.sync_weights_interval == 1
    if conf.mode == "disagg":
        set_driver_threads(conf, engine_cpus, trainer_cpus)
    engine = backend = None
    try:
        if conf.backend.ranked:
            backend = start_ranked_backend(conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed,
                                           cpus_per_worker=trainer_cpus, timeout_s=conf.timeout_s,
                                           node_ranks=trainer_at, put_weights_after_step=put_after_step)
        elif conf.mode == "disagg":
            backend = start_backend_actor(conf, trainer_cpus, trainer_gpus, node_ranks=trainer_at,
                                          put_weights_after_step=put_after_step)
        if conf.mode == "disagg":
            from rlharness.distributed.spawn import spawn_engines

            # A restarted engine cannot rejoin a broadcast group: no restarts there (resume instead).
            engine = spawn_engines(conf.engine, conf.model, conf.seed, cpus=engine_cpus, gpus=engine_gpus,
                                   timeout_s=conf.timeout_s, node_ranks=engine_at,
                                   max_restarts=ENGINE_MAX_RESTARTS if route == OBJECT_STORE else 0)
    except BaseException:
        import asyncio

        if engine is not None:
            asyncio.run(engine.close())
        if backend is not None:
            asyncio.run(backend.close())
        raise
    return RemoteParts(engine, backend, route)


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


def start_backend_actor(conf: RunConf, cpus: float, gpus: float, node_ranks: list[int] | None = None,
                        put_weights_after_step: bool = False):
    """One training actor hosting the backend `build_backend` makes for `conf.backend`."""
    from rlharness.backend import build_backend
    from rlharness.distributed.train_actor import spawn_train_workers

    def factory(rank: int, addr: str, port: int):
        return functools.partial(build_backend, conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed)

    return spawn_train_workers(factory, 1, cpus, gpus, {}, conf.timeout_s, name=conf.backend.name,
                               node_ranks=node_ranks, put_weights_after_step=put_weights_after_step)
