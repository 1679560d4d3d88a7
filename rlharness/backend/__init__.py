"""Training backends (`backend=torch | deepspeed | sim`), built by name."""

from __future__ import annotations

from typing import Any

from rlharness.backend.base import TrainingBackend
from rlharness.config.schema import AlgoConf, BackendConf, ModelConf

BACKEND_NAMES = ("torch", "deepspeed", "sim")


def build_backend(conf: BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int,
                  **kw: Any) -> TrainingBackend:
    """The backend named by `conf.name`; imports are lazy so `sim` runs never load torch models."""
    if conf.name == "torch":
        from rlharness.backend.torch_backend import TorchBackend

        return TorchBackend(conf, model_conf, algo, total_steps, seed)
    if conf.name == "sim":
        from rlharness.backend.sim import SimBackend

        return SimBackend(conf)
    raise ValueError(f"backend.name={conf.name!r} is not allowed: expected one of {', '.join(BACKEND_NAMES)}")


__all__ = ["BACKEND_NAMES", "TrainingBackend", "build_backend"]
