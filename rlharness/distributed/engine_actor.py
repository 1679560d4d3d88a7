"""The rollout engine as a Ray actor: `EngineActor` hosts one engine built by `build_engine`.

It is an async actor (many concurrent `generate` calls share its event loop, the
engine does its own batching). After Ray restarts it (`max_restarts`), the fresh
process holds the initial weights, not the ones the run has reached: it refuses to
serve (`EngineNeedsWeights`) until the driver-side proxy has re-sent the current
weights (or confirmed none were ever pushed). Each incarnation has its own
`instance_id`, so the proxy can tell a restart from a slow call.
"""

from __future__ import annotations

import logging
import os
import uuid
import warnings
from typing import Any

from rlharness.config.schema import EngineConf, ModelConf
from rlharness.engine.base import GenerateRequest, GenerateResult

log = logging.getLogger(__name__)

# Concurrent calls one engine actor accepts: every in-flight generate holds one.
ENGINE_MAX_CONCURRENCY = 4096


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
        self.engine = build_engine(engine_conf, model_conf, seed)
        self.versions_loaded: list[int] = []
        log.info("engine actor %s (instance %s, pid %d) up%s", name, self.instance_id, os.getpid(),
                 " after a restart: waiting for weights" if restarted else "")

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.needs_weights:
            raise EngineNeedsWeights(f"engine actor {self.name} restarted and has no weights yet")
        return await self.engine.generate(request)

    async def abort_all(self) -> int:
        return await self.engine.abort_all()

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        await self.engine.load_weights(state, version)
        self.versions_loaded.append(int(version))
        self.needs_weights = False

    def mark_ready(self) -> None:
        """The run never pushed weights: the initial ones this process loaded are current."""
        self.needs_weights = False

    def info(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "version": self.engine.version,
                "needs_weights": self.needs_weights, "versions_loaded": list(self.versions_loaded),
                "pid": os.getpid()}

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    async def close(self) -> None:
        await self.engine.close()
