"""The two routes a weight version takes to engine actors, chosen once when the run is built.

`build_remote_components` picks the route (`weight_transfer.choose_route`, from the
engine's declared `engine.weight_sync` and where the actors sit); every engine proxy
then holds one route object and calls it, whatever the payload:

- `ObjectStoreRoute` (the default): one `ray.put` per version, or the reference training
  rank 0 already made (`RemoteWeights`); every engine reads that one object, and an engine
  Ray restarts is sent it again. The object is a `PackedWeights` (copied once into the
  store, read by the engine without a copy);
- `GroupRoute`: a broadcast group (NCCL or gloo) of training rank 0 and every engine,
  formed by `setup_weight_group`; the payload is the trainer's `CollectiveWeights`, one
  broadcast reaches every engine at once, and a restarted engine cannot rejoin (its proxy
  raises `EngineLost`: resume from a checkpoint).

The pieces both share (specs, buckets, group members, payloads) are in
`rlharness.weights.transfer`; both routes are bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import ray

from rlharness.cluster.placement import wait_all
from rlharness.weights.transfer import (OBJECT_STORE, CollectiveWeights, RemoteWeights, WeightGroup, WeightGroupError,
                                       for_object_store)

log = logging.getLogger(__name__)


def to_object_ref(state: Mapping[str, Any] | Any) -> Any:
    """An ObjectRef for `state`: the one it already has, or a single new `ray.put`."""
    if isinstance(state, RemoteWeights):
        return state.ref
    if isinstance(state, ray.ObjectRef):
        return state
    return ray.put(for_object_store(state))


class ObjectStoreRoute:
    """Through the Ray object store: one object per version for every engine; re-sent after a restart."""

    name = OBJECT_STORE
    resendable = True

    async def load(self, engines: list[Any], state: Mapping[str, Any] | Any, version: int) -> None:
        for e in engines:
            e.check_forward(version)
        ref = to_object_ref(state)
        await asyncio.gather(*(e.push_ref(ref, version) for e in engines))


class GroupRoute:
    """By broadcast in the run's weight group: one transfer reaches every engine at once."""

    resendable = False

    def __init__(self, group: WeightGroup) -> None:
        self.group = group
        self.name = group.backend

    async def load(self, engines: list[Any], state: CollectiveWeights, version: int) -> None:
        for e in engines:
            e.check_forward(version)
        async with contextlib.AsyncExitStack() as held:
            for e in engines:
                await held.enter_async_context(e.weights_lock())
                e.target = (state, int(version))
            stats = await state.transfer([e.actor for e in engines], int(version))
            for e, st in zip(engines, stats):
                e.loaded(int(version), st)


OBJECT_STORE_ROUTE = ObjectStoreRoute()


def setup_weight_group(train_backend: Any, engine: Any, backend: str, timeout_s: float) -> WeightGroup:
    """Form the group (training rank 0 + every engine actor) and attach it to `train_backend`.

    `train_backend` is a `RemoteBackend`; `engine` a `RemoteEngine` or `RayEngineRouter`.
    Blocking (called while building the run); raises `WeightGroupError` naming a member
    that fails or does not join within `timeout_s`.
    Every engine proxy (and `engine` itself) then loads weights by this group's `GroupRoute`.
    """
    engines = engine.engines
    engine_actors = [e.actor for e in engines]
    names = [train_backend.names[0], *(e.name for e in engines)]
    # An engine with several workers (vLLM with tensor parallelism) takes a rank per worker.
    ranks = wait_all([a.weight_group_ranks.remote() for a in engine_actors], names[1:], "weight group ranks",
                     timeout_s)
    first_rank = [1 + sum(ranks[:i]) for i in range(len(ranks))]
    world_size = 1 + sum(ranks)
    sender = train_backend.actors[0]
    host, port = wait_all([sender.address.remote()], [train_backend.names[0]], "weight group address", timeout_s)[0]
    joins = [sender.weight_group_join.remote(backend, host, port, 0, world_size, timeout_s)]
    joins += [a.weight_group_join.remote(backend, host, port, first_rank[i], world_size, timeout_s)
              for i, a in enumerate(engine_actors)]
    try:
        wait_all(joins, names, f"joining the {backend} weight group at {host}:{port}", timeout_s + 5.0)
    except (RuntimeError, TimeoutError) as exc:
        raise WeightGroupError(str(exc)) from exc
    group = WeightGroup(list(train_backend.actors), engine_actors, backend, timeout_s)
    train_backend.weight_group = group
    route = GroupRoute(group)
    for e in {id(x): x for x in (engine, *engines)}.values():
        e.route = route
    log.info("weight group (%s) formed: training rank 0 + %d engine(s), rendezvous %s:%d",
             backend, len(engine_actors), host, port)
    return group
