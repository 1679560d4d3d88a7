"""Driver-side proxies that make engine actors look like local `RolloutEngine`s.

`RemoteEngine` talks to one `EngineActor`; `generate` calls made within
`coalesce_window_s` of each other travel in one streaming actor call
(`RequestBatcher`), each answered as soon as its own request finishes:
- a request that was in flight when the actor died comes back as finish "abort"
  with no tokens, so the agent loop marks it ABORTED and the manager puts its group
  back in the buffer to be sampled again; the proxy counts it (`requests_failed`);
- after Ray restarts the actor, the proxy notices (new `instance_id`, or the actor
  refusing to serve), counts the restart and re-sends the last weights it pushed,
  with their version (whole, where syncs send differences), before the engine serves again;
- weight versions only go forward, and a load that takes longer than `timeout_s`
  raises `WeightSyncTimeout` (and cancels the call) instead of blocking forever.

`RayEngineRouter` is the `EngineRouter` over several proxies. A run's weights reach them
through its weight channel (`weight_channel`: the object store, one object for every engine,
or a broadcast group); `load_weights` puts a state this process holds into the object store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from rlharness.distributed.engine_actor import EngineNeedsWeights
from rlharness.cluster.placement import describe_node
from rlharness.distributed.request_batcher import RequestBatcher, result_or_abort
from rlharness.distributed.object_store_weights import to_object_ref
from rlharness.distributed.weight_channel import WeightSyncTimeout
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine
from rlharness.engine.router import EngineRouter

log = logging.getLogger(__name__)

ACTOR_GONE = (RayActorError, ActorUnavailableError)
# A restarted actor refusing to serve is re-synced and asked again at most this often per request.
MAX_RESYNCS_PER_REQUEST = 3
RESTART_POLL_S = 0.2
# After an engine's node died: how long a restart on another node may take before the run stops.
NODE_LOST_GRACE_S = 30.0
NODE_CHECK_S = 2.0
# Requests made within this long of each other go to the actor in one call (see request_batcher).
COALESCE_WINDOW_S = 0.002


class EngineLost(RuntimeError):
    """An engine actor is gone for good (no restarts left) or did not come back in time."""


def _now() -> float | None:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


class RemoteEngine(RolloutEngine):
    def __init__(self, actor: Any, name: str, timeout_s: float, placement_group: Any = None,
                 start_timeout_s: float | None = None, coalesce_window_s: float = COALESCE_WINDOW_S) -> None:
        self.actor = actor
        self._batcher = RequestBatcher(actor, name, coalesce_window_s)
        self._closing = False
        self.placement_group = placement_group  # removed on close when this proxy owns it
        self.name = name
        self.timeout_s = timeout_s
        # Also waits until the engine is built (model load), which may take longer than a transfer.
        info = ray.get(actor.info.remote(), timeout=start_timeout_s or timeout_s)
        self._instance_id: str = info["instance_id"]
        self.node: dict[str, str] = info["node"]  # where the actor runs (node_info)
        log.info("placed %s on %s (%s)", name, self.node["hostname"], self.node["ip"])
        self._version: int = int(info["version"])
        # (object ref, version) last pushed: what a restarted actor is sent again. The ref is None for
        # a version that came by broadcast: a restarted actor cannot rejoin the group.
        self.target: tuple[Any, int] | None = None
        # With delta syncs (set by the object-store weight channel): `await whole_version_ref(version)` is
        # an object of every tensor of `version`, for a restarted actor (its initial weights are no base
        # for the difference `target` may hold).
        self.whole_version_ref: Any = None
        self._resync_needed = False
        self._lock: asyncio.Lock | None = None  # made in the loop that uses it
        self._in_flight = 0
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._window_start: float | None = None
        self._engine_stats: dict[str, float] = {}
        self.restarts = 0
        self.requests_failed = 0
        self.weight_loads = 0

    # ------------------------------------------------------------------ interface
    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        for _ in range(MAX_RESYNCS_PER_REQUEST):
            if self._resync_needed:
                await self._resync()
            self._enter()
            fut = self._batcher.submit(request)
            try:
                return await fut
            except EngineNeedsWeights:  # restarted while idle: nothing was generated, ask again
                self._resync_needed = True
            except ACTOR_GONE as exc:
                self._resync_needed = True
                self.requests_failed += 1
                log.warning("engine %s: request %s lost with the actor (%s); returned as aborted",
                            self.name, request.request_id, type(exc).__name__)
                return result_or_abort(request)
            except asyncio.CancelledError:
                if fut.cancelled() and not self._closing:
                    self._batcher.cancel(request)  # free the engine's slot too
                raise
            finally:
                self._leave()
        raise EngineLost(f"engine {self.name}: still without weights after {MAX_RESYNCS_PER_REQUEST} re-syncs")

    async def abort_all(self) -> int:
        self._batcher.flush()  # queued requests reach the engine before the abort does
        try:
            return int(await asyncio.wait_for(self.actor.abort_all.remote(), self.timeout_s))
        except ACTOR_GONE:  # its requests fail (and come back aborted) on their own
            self._resync_needed = True
            return 0

    @property
    def engines(self) -> list[RemoteEngine]:
        """The engine proxies a weight route reaches through this one: itself."""
        return [self]

    async def load_weights(self, state: Mapping[str, Any] | Any, version: int) -> None:
        """Put `state` (held here, or already in the store) into the object store; the actor reads it."""
        self.check_forward(version)
        await self.push_ref(to_object_ref(state), version)

    def check_forward(self, version: int) -> None:
        if version < self._version:
            raise ValueError(f"engine {self.name}: weight version {version} arrived after version "
                             f"{self._version}; versions must not go back")

    async def push_ref(self, ref: Any, version: int) -> None:
        """The object-store route: the actor reads `ref` as `version`; a death waits for its restart."""
        async with self.weights_lock():
            self.target = (ref, int(version))  # what a restarted actor must get, even if this push fails
            try:
                await self._push(ref, int(version))
            except ACTOR_GONE:
                log.warning("engine %s died during load_weights(version=%d); waiting for its restart",
                            self.name, version)
                await self._resync_locked()

    async def close(self) -> None:
        self._closing = True
        await self._batcher.close()
        try:
            await asyncio.wait_for(self.actor.close.remote(), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - closing a dead or hung actor must still kill it
            log.warning("engine %s: close failed (%r); killing the actor", self.name, exc)
        ray.kill(self.actor, no_restart=True)
        _remove(self)

    def stats(self) -> dict[str, float]:
        """The actor's engine counters (fetched at each weight load) plus the proxy's own.

        `busy_frac` is the engine's own measure when it has one, else the fraction of
        time since the previous call with at least one request in flight (`inflight_frac`).
        """
        now = _now()
        inflight_frac = 0.0
        if now is not None:
            busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
            if self._window_start is not None and now > self._window_start:
                inflight_frac = min(1.0, busy / (now - self._window_start))
            self._busy_s, self._window_start = 0.0, now
            if self._busy_since is not None:
                self._busy_since = now
        out = dict(self._engine_stats)
        out.setdefault("busy_frac", inflight_frac)
        b = self._batcher
        out.update({"inflight_frac": inflight_frac, "in_flight": float(self._in_flight),
                    "requests_per_call": b.requests / b.calls if b.calls else 0.0,
                    "restarts": float(self.restarts), "requests_failed": float(self.requests_failed),
                    "weight_loads": float(self.weight_loads), "version": float(self._version)})
        return out

    async def info(self) -> dict[str, Any]:
        """The actor's own view (instance, version, every version it loaded), for tests and debugging."""
        return await asyncio.wait_for(self.actor.info.remote(), self.timeout_s)

    # ------------------------------------------------------------------ internals
    def weights_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _enter(self) -> None:
        now = _now()
        if self._window_start is None:
            self._window_start = now
        if self._in_flight == 0:
            self._busy_since = now
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._busy_since is not None:
            now = _now()
            if now is not None:
                self._busy_s += now - self._busy_since
            self._busy_since = None

    async def _push(self, ref: Any, version: int) -> None:
        call = self.actor.load_weights.remote(ref, version)
        try:
            stats = await asyncio.wait_for(call, self.timeout_s)
        except asyncio.TimeoutError:
            ray.cancel(call)
            raise WeightSyncTimeout(f"engine {self.name}: load_weights(version={version}) did not finish "
                                    f"within timeout_s={self.timeout_s:g}") from None
        self.loaded(version, stats)

    def loaded_from_group(self, version: int, stats: Any) -> None:
        """The actor received `version` by broadcast (the channel holds `weights_lock` meanwhile)."""
        self.target = (None, int(version))
        self.loaded(version, stats)

    def loaded(self, version: int, stats: Any) -> None:
        self._version = version
        self.weight_loads += 1
        if isinstance(stats, dict):  # the actor answers with its counters: no extra round trip
            self._engine_stats = dict(stats)

    async def _resync(self) -> None:
        async with self.weights_lock():
            if self._resync_needed:
                await self._resync_locked()

    async def _resync_locked(self) -> None:
        """Wait for the actor to answer; if it is a new incarnation, count it and give it the weights."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        node_dead_deadline = None
        while True:
            try:
                # Short waits: a call to an actor Ray is still restarting hangs until it is back.
                wait_s = min(max(deadline - loop.time(), 0.01), NODE_CHECK_S)
                info = await asyncio.wait_for(self.actor.info.remote(), wait_s)
                break
            except (asyncio.TimeoutError, *ACTOR_GONE) as exc:
                node, alive = describe_node(self.node["node_id"])
                if not alive and node_dead_deadline is None:  # a restart elsewhere gets a grace period
                    node_dead_deadline = loop.time() + min(self.timeout_s, NODE_LOST_GRACE_S)
                    log.warning("engine %s: its Ray node %s died; waiting up to %g s for a restart elsewhere",
                                self.name, node, node_dead_deadline - loop.time())
                if node_dead_deadline is not None and loop.time() >= node_dead_deadline:
                    raise EngineLost(f"engine {self.name}: its Ray node {node} died and it did not restart on "
                                     f"another node within {min(self.timeout_s, NODE_LOST_GRACE_S):g} s; "
                                     f"resume the run from its last checkpoint") from exc
                if loop.time() >= deadline:
                    raise EngineLost(f"engine {self.name}: actor did not come back within "
                                     f"timeout_s={self.timeout_s:g} ({exc!r})") from exc
                await asyncio.sleep(RESTART_POLL_S)
        if info["instance_id"] != self._instance_id:
            self.restarts += 1
            self._instance_id = info["instance_id"]
            log.warning("engine %s restarted (instance %s, pid %s); re-sending weights version %s",
                        self.name, info["instance_id"], info["pid"],
                        self.target[1] if self.target else "0 (initial)")
        if info["needs_weights"] or (self.target is not None and info["version"] != self.target[1]):
            if self.target is not None and self.target[0] is None:
                raise EngineLost(f"engine {self.name} restarted, but a weight broadcast group cannot "
                                 f"re-admit a member; resume the run from its last checkpoint")
            if self.target is not None:
                ref, version = self.target
                if self.whole_version_ref is not None:
                    ref = await self.whole_version_ref(version)
                await self._push(ref, version)
            else:
                await asyncio.wait_for(self.actor.mark_ready.remote(), self.timeout_s)
        self._resync_needed = False


def _remove(owner: Any) -> None:
    if owner.placement_group is not None:
        ray.util.remove_placement_group(owner.placement_group)
        owner.placement_group = None


class RayEngineRouter(EngineRouter):
    """Several engine actors; one object-store copy of each weight version for all of them."""

    def __init__(self, engines: list[RemoteEngine], placement_group: Any = None) -> None:
        super().__init__(engines)
        self.placement_group = placement_group

    async def close(self) -> None:
        await super().close()
        _remove(self)

    async def load_weights(self, state: Mapping[str, Any] | Any, version: int) -> None:
        for e in self.engines:
            e.check_forward(version)
        ref = to_object_ref(state)
        await asyncio.gather(*(e.push_ref(ref, version) for e in self.engines))

    def stats(self) -> dict[str, float]:
        out = super().stats()
        for key in ("inflight_frac", "version"):  # means, not sums
            if key in out:
                out[key] /= len(self.engines)
        return out


__all__ = ["EngineLost", "RayEngineRouter", "RemoteEngine", "WeightSyncTimeout"]
