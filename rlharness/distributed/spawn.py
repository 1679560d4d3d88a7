"""Start engine actors (one placement group) and wrap them in driver-side proxies."""

from __future__ import annotations

import logging

import ray

from rlharness.config.schema import EngineConf, ModelConf
from rlharness.distributed.engine_actor import ENGINE_MAX_CONCURRENCY, EngineActor
from rlharness.cluster.placement import in_bundle, make_placement_group, thread_env, threads_for
from rlharness.distributed.remote_engine import RayEngineRouter, RemoteEngine
from rlharness.engine.base import RolloutEngine

log = logging.getLogger(__name__)


def spawn_engines(engine_conf: EngineConf, model_conf: ModelConf, seed: int, *, cpus: float, gpus: float,
                  timeout_s: float, max_restarts: int = 3, actor_cls: type = EngineActor,
                  name: str = "engine", start_timeout_s: float | None = None,
                  node_ranks: list[int] | None = None) -> RolloutEngine:
    """`engine_conf.num_engines` engine actors; one `RemoteEngine`, or a `RayEngineRouter` over several.

    Ray restarts a dead engine actor up to `max_restarts` times (the proxy then re-sends
    the current weights). Engine i is seeded `seed + i`. `timeout_s` bounds every call
    (a weight transfer included); `start_timeout_s` (default `timeout_s`) the start.
    """
    count = engine_conf.num_engines
    start_timeout_s = start_timeout_s or timeout_s
    pg = make_placement_group(f"{name}s", count, cpus, gpus, start_timeout_s, node_ranks)
    remote_cls = ray.remote(actor_cls)
    names = [f"{name}{i}" for i in range(count)]
    actors = [remote_cls.options(num_cpus=cpus, num_gpus=gpus, max_restarts=max_restarts, max_task_retries=0,
                                 max_concurrency=ENGINE_MAX_CONCURRENCY, runtime_env={"env_vars": thread_env(cpus)},
                                 **in_bundle(pg, i))
              .remote(engine_conf, model_conf, seed + i, names[i], threads_for(cpus))
              for i in range(count)]
    try:
        proxies = [RemoteEngine(a, n, timeout_s, start_timeout_s=start_timeout_s) for a, n in zip(actors, names)]
    except BaseException:
        for a in actors:
            ray.kill(a, no_restart=True)
        ray.util.remove_placement_group(pg)
        raise
    log.info("%d engine actor(s) up (%g CPU, %g GPU each, max_restarts=%d)", count, cpus, gpus, max_restarts)
    if count == 1:
        proxies[0].placement_group = pg
        return proxies[0]
    return RayEngineRouter(proxies, placement_group=pg)
