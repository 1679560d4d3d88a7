"""Training backends (`backend=torch | deepspeed | fsdp2 | sim`), built by name (rlharness/config/registry.py).

torch, deepspeed and fsdp2 are one `Learner` (learner.py: the loss loop) over their own model runners
(runner.py); deepspeed and fsdp2 (`BackendConf.ranked`) run one learner per rank, each in a Ray actor
(`rlharness.distributed.train_actor.start_ranked_backend` builds them with this function and a rank).
"""

from __future__ import annotations

from typing import Any

from rlharness.backend.base import TrainingBackend
from rlharness.config import registry
from rlharness.config.schema import AlgoConf, BackendConf, ModelConf


def build_backend(conf: BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int,
                  **rank: Any) -> TrainingBackend:
    """The backend `conf.name` names (rlharness/config/registry.py); a ranked one as one rank, with `rank`'s
    `rank`, `world_size`, `master_addr`, `master_port` (rank 0's rendezvous) and `timeout_s`."""
    if conf.ranked and not rank:
        raise ValueError(f"backend={conf.name} runs as ranks on Ray actors: start it with "
                         f"rlharness.distributed.train_actor.start_ranked_backend")
    return registry.build("backend", conf, model_conf, algo, total_steps, seed, **rank)


def rank_env(conf: BackendConf) -> dict[str, str]:
    """Environment variables a ranked backend's processes need before they import anything."""
    if conf.name == "deepspeed":
        from rlharness.backend.deepspeed_runner import worker_env

        return worker_env(conf.device)
    return {}


__all__ = ["TrainingBackend", "build_backend", "rank_env"]
