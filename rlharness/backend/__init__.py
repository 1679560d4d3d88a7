"""Training backends (`backend=torch | deepspeed | sim`), built by name (rlharness/config/registry.py)."""

from __future__ import annotations

from typing import Any

from rlharness.backend.base import TrainingBackend
from rlharness.config import registry
from rlharness.config.schema import AlgoConf, BackendConf, ModelConf

def build_backend(conf: BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int,
                  **kw: Any) -> TrainingBackend:
    """The backend `conf.name` names, in this process (rlharness/config/registry.py); backends whose
    ranks are Ray actors (deepspeed) are started by rlharness.distributed.train_actor."""
    return registry.build("backend", conf, model_conf, algo, total_steps, seed, **kw)


__all__ = ["TrainingBackend", "build_backend"]
