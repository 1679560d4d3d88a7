"""Training workers as Ray actors, and the driver-side `RemoteBackend` over them.

A `TrainWorkerActor` hosts one process's backend object (a `Learner`: backend=torch's, or one
rank of backend=deepspeed's or fsdp2's; a `SimBackend`), built by a picklable factory after the
actor is up (ranks first need rank 0's address). `RemoteBackend` implements `TrainingBackend` by
calling every worker at once (data parallel: each does its share and the collectives meet) and
answering with rank 0's result. A host calls only the backend methods named in `HOSTED_METHODS`.

Training actors are not restarted: one that dies stops the run with
`TrainingWorkerDied`, naming it; the last complete checkpoint stays resumable
(checkpoints are committed atomically by the trainer).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import time
from typing import Any, Callable

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from rlharness.backend.base import TrainingBackend
from rlharness.cluster.placement import (describe_node, in_bundle, make_placement_group, node_info, thread_env,
                                             threads_for, wait_all)
from rlharness.cluster.ray_cluster import free_port
from rlharness.config.schema import AlgoConf, BackendConf, ModelConf
from rlharness.core.types import TrainBatch
from rlharness.distributed.object_store_weights import RemoteWeights, for_object_store
from rlharness.distributed.weight_channel import weights_to_send
from rlharness.weights.delta import DeltaEncoder, WeightEncoding
from rlharness.weights.transfer import WeightGroupMember, state_bytes

log = logging.getLogger(__name__)


class TrainingWorkerDied(RuntimeError):
    """A training actor died; the run cannot continue (resume from the last checkpoint)."""


# What a host calls on its backend (`TrainWorkerActor.call`): the `TrainingBackend` interface, and the
# critic's weights for the tests and benchmarks that compare them across backends.
HOSTED_METHODS = frozenset({"train_step", "get_weights", "save", "load", "critic_weights_blocking"})


class TrainWorkerActor:
    def __init__(self, env: dict[str, str], num_threads: int) -> None:
        os.environ.update(env)
        import torch

        torch.set_num_threads(max(1, num_threads))
        self.backend: Any = None
        self.weight_member: WeightGroupMember | None = None  # rank 0, once a weight group is formed
        # What weights become before they leave (the engine's dtype, delta syncs); set by the weight channel.
        self.weight_encoder: DeltaEncoder = WeightEncoding().encoder()

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port (rank 0's become MASTER_ADDR/MASTER_PORT)."""
        return ray.util.get_node_ip_address(), free_port()

    def node(self) -> dict[str, str]:
        return node_info()

    def build(self, factory: Callable[[], Any]) -> None:
        self.backend = factory()

    async def call(self, method: str, *args: Any) -> Any:
        if method not in HOSTED_METHODS:
            raise ValueError(f"training worker: {method!r} is not a hosted backend method "
                             f"({', '.join(sorted(HOSTED_METHODS))})")
        result = getattr(self.backend, method)(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def train_and_put_weights(self, batch: TrainBatch) -> tuple[dict[str, float], list[Any]]:
        """`train_step`, then the new weights into the object store at once (see `RemoteBackend`)."""
        started = time.perf_counter()
        metrics = dict(await self.call("train_step", batch))
        metrics["perf/train_worker_s"] = time.perf_counter() - started
        return metrics, await self.put_weights()

    async def weight_group_join(self, backend: str, host: str, port: int, rank: int, world_size: int,
                                timeout_s: float) -> None:
        """Join the weight broadcast group with the engines (rank 0 only; see `rlharness.weights.transfer`)."""
        self.weight_member = await asyncio.to_thread(WeightGroupMember, backend, host, port, rank, world_size,
                                                     timeout_s)

    def set_weight_encoding(self, encoding: WeightEncoding) -> None:
        self.weight_encoder = encoding.encoder()

    async def weight_group_send(self, version: int, full: bool = False) -> int:
        """Every rank takes the weights (ZeRO-3 gathers collectively); the group member (rank 0)
        broadcasts them, encoded (`full`: no differences). Returns the bytes sent (0 on the other ranks)."""
        state = await weights_to_send(self.backend)  # this actor runs one call at a time: nothing trains meanwhile
        if self.weight_member is None:
            return 0
        state = self.weight_encoder.encode(state, full)
        await asyncio.to_thread(self.weight_member.send, state, version)
        return state_bytes(state)

    async def put_weights(self, full: bool = False) -> list[Any]:
        """`get_weights`, encoded, into the object store (a state dict as `PackedWeights`: one copy); [ref],
        [] for none.

        From the live tensors where the backend offers them: `ray.put` (or the encoder's cast) is the copy."""
        state = await weights_to_send(self.backend)
        return [] if state is None else [ray.put(for_object_store(self.weight_encoder.encode(state, full)))]

    def commit_weights(self, version: int) -> None:
        """The last weights sent reached every engine as `version` (the base of the next difference)."""
        self.weight_encoder.commit(version)

    def put_version_weights(self, version: int) -> Any:
        """Every tensor of `version` whole (the committed one, or the one in flight) into the object
        store: for an engine that restarted with its initial weights."""
        return ray.put(for_object_store(self.weight_encoder.version_state(version)))


class RemoteBackend(TrainingBackend):
    """`TrainingBackend` over one or more `TrainWorkerActor`s (rank order).

    With `put_weights_after_step` (set when the run is built, for the object-store route when
    every step is followed by a weight sync), each `train_step` also has rank 0 put the new
    weights into the object store before it answers, and the next `weights_ref` returns that
    reference without another call: the copy happens while the producer is still running, not
    inside the sync that pauses it.
    """

    def __init__(self, actors: list[Any], names: list[str], timeout_s: float, placement_group: Any = None,
                 put_weights_after_step: bool = False) -> None:
        if not actors or len(actors) != len(names):
            raise ValueError(f"RemoteBackend needs one name per actor (got {len(actors)} actors, {len(names)} names)")
        self.actors = actors
        self.names = names
        self.timeout_s = timeout_s
        self.placement_group = placement_group
        self.put_weights_after_step = put_weights_after_step
        self._prefetched: Any = None  # ObjectRef of the weights right after the last train_step
        self.nodes: list[dict[str, str]] = []  # where each rank runs (node_info), set at start

    async def _on_all(self, method: str, *args: Any) -> list[Any]:
        """Call the backend's `method` on every worker at once; results in rank order."""
        return await self._on_all_actors("call", method, *args)

    async def _on_all_actors(self, actor_method: str, *args: Any) -> list[Any]:
        """Call the actors' own `actor_method` on every worker at once; results in rank order."""
        method = args[0] if actor_method == "call" else actor_method
        refs = [getattr(a, actor_method).remote(*args) for a in self.actors]
        tasks = [asyncio.ensure_future(_await(r)) for r in refs]
        # The first failure ends the wait: its peers may be blocked in a collective with it.
        _, pending = await asyncio.wait(tasks, timeout=self.timeout_s, return_when=asyncio.FIRST_EXCEPTION)
        failed = [(i, t.exception()) for i, t in enumerate(tasks) if t.done() and t.exception() is not None]
        dead = [(i, e) for i, e in failed if isinstance(e, (RayActorError, ActorUnavailableError))]
        if failed:
            _cancel(tasks, refs)
            i, exc = (dead or failed)[0]
            if dead:
                raise TrainingWorkerDied(f"training worker {self.names[i]}{self._where(i)} died during {method}: "
                                         f"{type(exc).__name__}: {exc}") from exc
            raise exc
        if pending:
            late = [self.names[i] for i, t in enumerate(tasks) if t in pending]
            _cancel(tasks, refs)
            raise TimeoutError(f"training worker(s) {late}: {method} did not finish within "
                               f"timeout_s={self.timeout_s:g}")
        return [t.result() for t in tasks]

    def _where(self, rank: int) -> str:
        """" on node <host> (<ip>), which is dead" or "" when unknown."""
        if rank >= len(self.nodes):
            return ""
        name, alive = describe_node(self.nodes[rank]["node_id"])
        return f" on node {name}" + ("" if alive else ", which Ray reports dead,")

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        ref = ray.put(batch)  # one copy for every rank
        self._prefetched = None
        if self.put_weights_after_step:
            metrics, weights = (await self._on_all_actors("train_and_put_weights", ref))[0]
            self._prefetched = weights[0] if weights else None
            return metrics
        return (await self._on_all("train_step", ref))[0]

    async def weights_ref(self, full: bool = False) -> Any:
        """An ObjectRef of the current weights, encoded, in the object store: the copy rank 0 made right
        after the step, or a new one (every rank takes part: ZeRO-3 gathers collectively). `full`: every
        tensor whole (a copy made after the step may hold differences: it is not used)."""
        if self._prefetched is not None and not full:
            ref, self._prefetched = self._prefetched, None
            return ref
        self._prefetched = None
        results = await self._on_all_actors("put_weights", full)
        if not results[0]:
            raise RuntimeError(f"training worker {self.names[0]} (rank 0) returned no weights")
        return results[0][0]

    async def get_weights(self, full: bool = False) -> RemoteWeights:
        """The current weights as a mapping that lives in the object store (fetched where it is read)."""
        return RemoteWeights(await self.weights_ref(full), self.timeout_s)

    async def send_to_group(self, version: int, full: bool = False) -> int:
        """Broadcast the current weights from rank 0 in the weight group it joined; bytes sent."""
        return (await self._on_all_actors("weight_group_send", version, full))[0]

    # Rank 0 encodes what leaves it (rlharness/weights/delta.py); the weight channel drives it.
    def set_weight_encoding(self, encoding: WeightEncoding) -> None:
        """Blocking (called while the run is built, before any step)."""
        wait_all([a.set_weight_encoding.remote(encoding) for a in self.actors], self.names, "weight encoding",
                 self.timeout_s)

    async def commit_weights(self, version: int) -> None:
        await asyncio.wait_for(_await(self.actors[0].commit_weights.remote(version)), self.timeout_s)

    async def version_weights_ref(self, version: int) -> Any:
        """An ObjectRef of every tensor of `version`, whole (`TrainWorkerActor.put_version_weights`)."""
        return await asyncio.wait_for(_await(self.actors[0].put_version_weights.remote(version)), self.timeout_s)

    async def save(self, directory: str) -> None:
        await self._on_all("save", directory)

    async def load(self, directory: str) -> None:
        self._prefetched = None
        await self._on_all("load", directory)

    async def probe_longest(self, rows: int, prompt_tokens: int, response_tokens: int) -> dict[str, Any] | None:
        return (await self._on_all("probe_longest", rows, prompt_tokens, response_tokens))[0]

    async def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            ray.util.remove_placement_group(self.placement_group)
            self.placement_group = None


async def _await(ref: Any) -> Any:
    return await ref


def _cancel(tasks: list[asyncio.Future], refs: list[Any]) -> None:
    for task, ref in zip(tasks, refs):
        if not task.done():
            task.cancel()
            ray.cancel(ref)


def spawn_train_workers(factory: Callable[[int, str, int], Callable[[], Any]], count: int, cpus: float,
                        gpus: float, env: dict[str, str], timeout_s: float, name: str,
                        node_ranks: list[int] | None = None, put_weights_after_step: bool = False) -> RemoteBackend:
    """`count` training actors in their own placement group, each hosting `factory(rank, addr, port)()`.

    `addr`/`port` are rank 0's node address and a free port there (the rendezvous of a
    process group). Training actors are never restarted (max_restarts=0).
    """
    pg = make_placement_group(f"{name}-train", count, cpus, gpus, timeout_s, node_ranks)
    names = [f"{name}-rank{i}" for i in range(count)]
    actor_cls = ray.remote(TrainWorkerActor)
    actors = [actor_cls.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0, max_concurrency=1, name=None,
                                runtime_env={"env_vars": {**thread_env(cpus), **env}}, **in_bundle(pg, i))
              .remote(env, threads_for(cpus))
              for i in range(count)]
    backend = RemoteBackend(actors, names, timeout_s, pg, put_weights_after_step)
    try:
        addr, port = wait_all([actors[0].address.remote()], names[:1], f"starting {name} training workers",
                              timeout_s)[0]
        wait_all([a.build.remote(factory(i, addr, port)) for i, a in enumerate(actors)], names,
                 f"building {name} training workers", timeout_s)
        backend.nodes = wait_all([a.node.remote() for a in actors], names, f"locating {name} training workers",
                                 timeout_s)
    except BaseException:
        _kill_all(actors, pg)
        raise
    log.info("%d %s training worker(s) up (rank 0 at %s:%d)", count, name, addr, port)
    for n, node in zip(names, backend.nodes):
        log.info("placed %s on %s (%s)", n, node["hostname"], node["ip"])
    return backend


def _kill_all(actors: list[Any], pg: Any) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)
    ray.util.remove_placement_group(pg)


def start_ranked_backend(conf: BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int, *,
                         cpus_per_worker: float = 1.0, timeout_s: float = 600.0, node_ranks: list[int] | None = None,
                         put_weights_after_step: bool = False) -> RemoteBackend:
    """`conf.workers` ranks of a ranked backend (backend=deepspeed, fsdp2: `conf.ranked`) on Ray actors in
    one placement group, each a learner built by `build_backend` with its rank.

    Returns a `RemoteBackend` (the `TrainingBackend` interface). Needs a running Ray
    (`rlharness.cluster.connect_ray`, which the launcher calls).
    """
    from rlharness.backend import build_backend, rank_env

    if not ray.is_initialized():
        raise RuntimeError(f"backend={conf.name} runs its ranks as Ray actors, but Ray is not running: use "
                           f"cluster=local_ray or cluster=slurm (or call rlharness.cluster.connect_ray first)")

    def factory(rank: int, addr: str, port: int):
        return functools.partial(build_backend, conf, model_conf, algo, total_steps, seed, rank=rank,
                                 world_size=conf.workers, master_addr=addr, master_port=port, timeout_s=timeout_s)

    gpus = 0.0 if conf.device == "cpu" else 1.0
    return spawn_train_workers(factory, conf.workers, cpus_per_worker, gpus, rank_env(conf), timeout_s,
                               name=conf.name, node_ranks=node_ranks, put_weights_after_step=put_weights_after_step)
