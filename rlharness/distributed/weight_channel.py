"""The weight channel: how each new weight version reaches the rollout engines, decided once.

The trainer calls `await channel.sync(version)` after a step (and once on resume) and nothing
else about weights. The channel is built once per run (`build_weight_channel`) from where the
engines live and the route (`choose_route`), and it owns both ends:

- `InProcessChannel`: the engine is in this process (colocated): it loads the state the backend
  hands over (a local state dict, or the `RemoteWeights` a Ray training rank put into the store).
- `ObjectStoreChannel`: engine actors (disaggregated): training rank 0 puts the version into the
  Ray object store once (right after the step when every step syncs, so the copy overlaps
  production) and every engine actor reads that one object; an engine Ray restarts is sent it
  again by its proxy.
- `BroadcastChannel`: engine actors in a broadcast group with training rank 0 (NCCL between GPUs,
  gloo otherwise), formed once (`form_weight_group`): rank 0 sends each bucket once, every engine
  receives; a restarted engine cannot rejoin (its proxy raises `EngineLost`: resume instead).

Backends expose the state to send (`get_weights`; a Ray-hosted backend also `weights_ref` and
`send_to_group`), engines a way to receive (`load_weights`; engine proxies `push_ref` and, in a
group, their actor's `weight_group_receive`). Every wait is bounded by `timeout_s`. Ray is
imported only by the channels that use it: a colocated run without Ray never loads it.

What leaves the sender is encoded where the trainer's weights are (`WeightEncoding`,
rlharness/weights/delta.py): cast to the engine's dtype and, with delta syncs, only what changed
since the last sync. Here (a backend in this process: `LocalSender`) or by training rank 0's actor
(a `RemoteBackend`). A sync that completes commits its version as the base of the next difference;
one that fails, and one after a resume (`sync(version, full=True)`), sends every tensor whole; an
engine Ray restarts is sent its version whole (`version_weights_ref`), never a difference.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from rlharness.weights.delta import WeightEncoding
from rlharness.weights.transfer import WeightGroupError, state_bytes

log = logging.getLogger(__name__)

# The routes a weight version can take to disaggregated engines.
IN_PROCESS, OBJECT_STORE, NCCL, GLOO = "in_process", "object_store", "nccl", "gloo"


def choose_route(weight_sync: str, engine_gpus: float, trainer_gpus: float) -> str:
    """How weights reach disaggregated engines, from the engine's declared `engine.weight_sync`.

    `disk` (vLLM reads a folder its engine process writes): the object store to the
    engine. Engines and trainers both on GPUs: an NCCL broadcast group. `collective` (an
    engine whose workers live in a process of their own, reachable only by a group):
    a gloo group when either side is on CPU. `auto`: the object store.
    """
    if weight_sync == "disk":
        return OBJECT_STORE
    if engine_gpus > 0 and trainer_gpus > 0:
        return NCCL
    return GLOO if weight_sync == "collective" else OBJECT_STORE


class WeightSyncTimeout(TimeoutError):
    """A weight transfer to an engine did not finish in time (the engine is hung, not slow)."""


@dataclass(frozen=True)
class SyncStats:
    # What the sync moved (LoRA: only the adapted tensors; delta syncs: only what changed; a broadcast:
    # every bucket once).
    bytes_sent: int


class LocalSender:
    """A backend in this process (colocated): what it hands over is encoded here. The same methods as a
    `RemoteBackend`, whose training rank 0 encodes."""

    def __init__(self, backend: Any, encoding: WeightEncoding) -> None:
        self.backend, self.encoder = backend, encoding.encoder()

    async def get_weights(self, full: bool = False) -> Any:
        return self.encoder.encode(await weights_to_send(self.backend), full)

    async def commit_weights(self, version: int) -> None:
        self.encoder.commit(version)


async def weights_to_send(backend: Any) -> Any:
    """A local backend's weights for a sync: its live tensors where it offers them (`weights_to_copy_now`:
    no snapshot; the encoder copies what it keeps, on the weights' device, and the sync is through before
    the backend trains again), else `get_weights`."""
    live = getattr(backend, "weights_to_copy_now", None)
    return live() if live is not None else await backend.get_weights()


def weight_sender(backend: Any, encoding: WeightEncoding) -> Any:
    """What a channel takes each version from: a Ray-hosted backend itself (told how to encode),
    else a `LocalSender` over the backend."""
    if hasattr(backend, "set_weight_encoding"):
        backend.set_weight_encoding(encoding)
        return backend
    return LocalSender(backend, encoding)


class WeightChannel(abc.ABC):
    route: str
    sender: Any  # the backend's side: `weight_sender`

    _full_next = False  # the last sync failed: an engine may hold part of it

    async def sync(self, version: int, full: bool = False) -> SyncStats:
        """Every engine holds the backend's current weights as `version` when this returns. `full`:
        every tensor whole, never a difference (after a resume: the engines hold another version)."""
        try:
            stats = await self._send(int(version), full or self._full_next)
        except BaseException:
            self._full_next = True
            raise
        self._full_next = False
        await self.sender.commit_weights(int(version))
        return stats

    @abc.abstractmethod
    async def _send(self, version: int, full: bool) -> SyncStats:
        """Move this version to every engine."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class InProcessChannel(WeightChannel):
    """The engine lives in this process: it loads the state the backend hands over."""

    route = IN_PROCESS

    def __init__(self, sender: Any, engine: Any) -> None:
        self.sender, self.engine = sender, engine

    async def _send(self, version: int, full: bool) -> SyncStats:
        state = await self.sender.get_weights(full)
        await self.engine.load_weights(state, version)
        # A `RemoteWeights` (a Ray training rank's object) knows its stored size.
        return SyncStats(state_bytes(state) if isinstance(state, dict) else int(getattr(state, "nbytes", 0)))


class ObjectStoreChannel(WeightChannel):
    """One object per version in the Ray object store, read by every engine actor."""

    route = OBJECT_STORE

    def __init__(self, sender: Any, engines: list[Any], timeout_s: float, delta: bool = False) -> None:
        self.sender, self.engines, self.timeout_s = sender, list(engines), timeout_s
        if delta:  # the last object may be a difference: a restarted engine is sent its version whole
            for e in self.engines:
                e.whole_version_ref = sender.version_weights_ref

    async def _send(self, version: int, full: bool) -> SyncStats:
        from rlharness.distributed.object_store_weights import stored_bytes

        for e in self.engines:
            e.check_forward(version)
        ref = await self.sender.weights_ref(full)
        await asyncio.gather(*(e.push_ref(ref, version) for e in self.engines))
        return SyncStats(stored_bytes(ref, self.timeout_s))


@dataclass
class WeightGroup:
    """A broadcast group: training rank 0 and these engine actors, in rank order."""

    engine_actors: list[Any]
    backend: str  # nccl | gloo
    timeout_s: float


class BroadcastChannel(WeightChannel):
    """By broadcast in the run's weight group: one transfer reaches every engine at once."""

    def __init__(self, sender: Any, engines: list[Any], group: WeightGroup) -> None:
        self.sender, self.engines, self.group = sender, list(engines), group
        self.route = group.backend

    async def _send(self, version: int, full: bool) -> SyncStats:
        for e in self.engines:
            e.check_forward(version)
        async with contextlib.AsyncExitStack() as held:  # no request or other load meets a half-sent version
            for e in self.engines:
                await held.enter_async_context(e.weights_lock())
            sent, stats = await self._transfer(version, full)
            for e, st in zip(self.engines, stats):
                e.loaded_from_group(version, st)
        return SyncStats(sent)

    async def _transfer(self, version: int, full: bool) -> tuple[int, list[dict[str, float]]]:
        """Rank 0 sends (every training rank takes part: ZeRO-3 gathers), every engine receives."""
        send = asyncio.ensure_future(self.sender.send_to_group(version, full))
        receives = [asyncio.ensure_future(_await(a.weight_group_receive.remote(version)))
                    for a in self.group.engine_actors]
        members = [send, *receives]
        names = ["training rank 0", *(f"engine {i}" for i in range(len(receives)))]
        try:
            # The members time out on their own (timeout_s); the margin covers the calls' round trips.
            done, pending = await asyncio.wait(members, timeout=self.group.timeout_s + 5.0,
                                               return_when=asyncio.FIRST_EXCEPTION)
            failed = [(n, f.exception()) for n, f in zip(names, members) if f in done and f.exception()]
            if failed:
                name, exc = failed[0]
                raise WeightGroupError(f"weight broadcast (version {version}, {self.group.backend}) failed at "
                                       f"{name}: {type(exc).__name__}: {exc}") from exc
            if pending:
                late = [n for n, f in zip(names, members) if f in pending]
                raise WeightSyncTimeout(f"weight broadcast (version {version}, {self.group.backend}): {late} did "
                                        f"not finish within timeout_s={self.group.timeout_s:g}")
        finally:
            for f in members:
                if not f.done():
                    f.cancel()
        return int(send.result() or 0), [f.result() for f in receives]


async def _await(ref: Any) -> Any:
    return await ref


def form_weight_group(backend: Any, engines: list[Any], group_backend: str, timeout_s: float) -> WeightGroup:
    """Form a broadcast group of training rank 0 (`backend`, a `RemoteBackend`) and every engine actor.

    Blocking (called while the run is built); raises `WeightGroupError` naming a member that fails
    or does not join within `timeout_s`. An engine with several workers (vLLM with tensor
    parallelism) takes a rank per worker.
    """
    from rlharness.cluster.placement import wait_all

    engine_actors = [e.actor for e in engines]
    names = [backend.names[0], *(e.name for e in engines)]
    ranks = wait_all([a.weight_group_ranks.remote() for a in engine_actors], names[1:], "weight group ranks",
                     timeout_s)
    first_rank = [1 + sum(ranks[:i]) for i in range(len(ranks))]
    world_size = 1 + sum(ranks)
    sender = backend.actors[0]
    host, port = wait_all([sender.address.remote()], names[:1], "weight group address", timeout_s)[0]
    joins = [sender.weight_group_join.remote(group_backend, host, port, 0, world_size, timeout_s)]
    joins += [a.weight_group_join.remote(group_backend, host, port, first_rank[i], world_size, timeout_s)
              for i, a in enumerate(engine_actors)]
    try:
        wait_all(joins, names, f"joining the {group_backend} weight group at {host}:{port}", timeout_s + 5.0)
    except (RuntimeError, TimeoutError) as exc:
        raise WeightGroupError(str(exc)) from exc
    log.info("weight group (%s) formed: training rank 0 + %d engine(s), rendezvous %s:%d",
             group_backend, len(engine_actors), host, port)
    return WeightGroup(engine_actors, group_backend, timeout_s)


def build_weight_channel(backend: Any, engine: Any, route: str, timeout_s: float,
                         encoding: WeightEncoding = WeightEncoding()) -> WeightChannel:
    """The run's channel: in process for a local engine, else the object store or a broadcast group
    (formed here, once) to the engine actors behind `engine` (a `RemoteEngine` or `RayEngineRouter`).
    `encoding`: what versions become before they leave the sender (the engine's dtype, delta syncs)."""
    sender = weight_sender(backend, encoding)
    if route == IN_PROCESS:
        return InProcessChannel(sender, engine)
    engines = engine.engines
    if route == OBJECT_STORE:
        return ObjectStoreChannel(sender, engines, timeout_s, encoding.delta)
    if route in (NCCL, GLOO):
        return BroadcastChannel(sender, engines, form_weight_group(backend, engines, route, timeout_s))
    raise ValueError(f"weight route {route!r} is not one of {IN_PROCESS}, {OBJECT_STORE}, {NCCL}, {GLOO}")

