"""The rollout engine as a Ray actor: `EngineActor` hosts one engine built by `build_engine`.

It is an async actor (many concurrent calls share its event loop, the engine does
its own batching). The driver-side proxy sends requests in batches
(`generate_batch`, a streaming call: each result comes back as soon as it is done,
with its index in the batch), because one Ray call per request costs more CPU than
decoding a tiny model's response; `generate` (one request) stays for other callers. After Ray restarts it (`max_restarts`), the fresh
process holds the initial weights, not the ones the run has reached: it refuses to
serve (`EngineNeedsWeights`) until the driver-side proxy has re-sent the current
weights (or confirmed none were ever pushed). Each incarnation has its own
`instance_id`, so the proxy can tell a restart from a slow call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
import warnings
from typing import Any, AsyncIterator

from rlharness.config.schema import EngineConf, ModelConf
from rlharness.engine.base import GenerateRequest, GenerateResult
from rlharness.distributed.object_store_weights import unpacked

log = logging.getLogger(__name__)

# Concurrent calls one engine actor accepts: every in-flight generate holds one.
ENGINE_MAX_CONCURRENCY = 4096


# What `generate_batch` yields per finished request: (index in the batch, result, error).
BatchItem = tuple[int, "GenerateResult | None", "BaseException | None"]


def _outcome(task: asyncio.Task) -> tuple[GenerateResult | None, BaseException | None]:
    if task.cancelled():
        return None, None
    return task.result() if task.exception() is None else None, task.exception()


class EngineNeedsWeights(RuntimeError):
    """A restarted engine actor has not yet been given the run's current weights."""


class EngineActor:
    """Runs inside the actor process. Subclass to change behaviour in tests (e.g. a slow load)."""

    def __init__(self, engine_conf: EngineConf, model_conf: ModelConf, seed: int, name: str,
                 num_threads: int = 1) -> None:
        import ray
        import torch

        torch.set_num_threads(max(1, num_threads))
        from rlharness.engine import build_engine

        self.name = name
        self.instance_id = uuid.uuid4().hex[:12]
        with warnings.catch_warnings():  # Ray's property uses a deprecated accessor internally
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.needs_weights = bool(restarted)
        self.engine = build_engine(engine_conf, model_conf, seed, name=name)
        self.versions_loaded: list[int] = []
        self._running: dict[str, asyncio.Task] = {}  # request_id -> its generate task (for cancel)
        log.info("engine actor %s (instance %s, pid %d) up%s", name, self.instance_id, os.getpid(),
                 " after a restart: waiting for weights" if restarted else "")

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.needs_weights:
            raise EngineNeedsWeights(f"engine actor {self.name} restarted and has no weights yet")
        return await self.engine.generate(request)

    async def generate_batch(self, requests: list[GenerateRequest]) -> AsyncIterator[list[BatchItem]]:
        """Start every request now; yield `(index, result, error)` for each as it finishes.

        Results that finish together travel together (one yield), so a batch costs a
        handful of object transfers, not one per request. A request cancelled through
        `cancel` yields `(index, None, None)`.
        """
        if self.needs_weights:
            raise EngineNeedsWeights(f"engine actor {self.name} restarted and has no weights yet")
        tasks = [asyncio.ensure_future(self.engine.generate(r)) for r in requests]
        index = {t: i for i, t in enumerate(tasks)}
        for r, t in zip(requests, tasks):
            self._running[r.request_id] = t
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                self._forget(requests, done, index)
                yield [(index[t], *_outcome(t)) for t in done]
        finally:  # the caller went away (cancelled stream): free the engine's slots
            for t in pending:
                t.cancel()
            self._forget(requests, pending, index)

    def _forget(self, requests: list[GenerateRequest], tasks: set[asyncio.Task], index: dict) -> None:
        for t in tasks:
            rid = requests[index[t]].request_id
            if self._running.get(rid) is t:
                del self._running[rid]

    def cancel(self, request_ids: list[str]) -> int:
        """Cancel these requests (their engine slots are freed); returns how many were running."""
        found = [self._running[i] for i in request_ids if i in self._running]
        for t in found:
            t.cancel()
        return len(found)

    async def abort_all(self) -> int:
        return await self.engine.abort_all()

    async def load_weights(self, state: dict[str, Any], version: int) -> dict[str, float]:
        """Load, then answer with the engine's counters (saves the proxy a `stats` call per sync).

        From the object store `state` is a `PackedWeights`: tensors that are views of the
        store's memory, which the engine's load copies from."""
        await self.engine.load_weights(unpacked(state), version)
        return self._weights_loaded(version)

    def _weights_loaded(self, version: int) -> dict[str, float]:
        self.versions_loaded.append(int(version))
        self.needs_weights = False
        return self.engine.stats()

    def weight_group_ranks(self) -> int:
        """Ranks this engine takes in a weight group (vLLM: one per worker; else this process)."""
        return self.engine.weight_group_ranks

    async def weight_group_join(self, backend: str, host: str, port: int, rank: int, world_size: int,
                                timeout_s: float) -> None:
        """Join the weight broadcast group with training rank 0 (`weight_channel`), from rank `rank` on."""
        await self.engine.join_weight_group(backend, host, port, rank, world_size, timeout_s)

    async def weight_group_receive(self, version: int) -> dict[str, float]:
        """Receive a version by broadcast and load it (the engine keeps serving until the swap)."""
        await self.engine.receive_weights(version)
        return self._weights_loaded(version)

    def mark_ready(self) -> None:
        """The run never pushed weights: the initial ones this process loaded are current."""
        self.needs_weights = False

    def info(self) -> dict[str, Any]:
        from rlharness.cluster.placement import node_info

        return {"instance_id": self.instance_id, "version": self.engine.version,
                "needs_weights": self.needs_weights, "versions_loaded": list(self.versions_loaded),
                "pid": os.getpid(), "node": node_info()}

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    async def close(self) -> None:
        await self.engine.close()
