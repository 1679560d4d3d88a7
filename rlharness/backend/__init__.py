"""Training backends (`backend=torch | deepspeed | fsdp2 | sim`), built by name.

torch, deepspeed and fsdp2 are one `Learner` (learner.py: the loss loop) over their own model runners
(runner.py); deepspeed and fsdp2 run one learner per rank, each in a Ray actor
(`rlharness.distributed.start_ranked_backend` builds them with this function and a rank).
"""

from __future__ import annotations

from rlharness.backend.base import TrainingBackend
from rlharness.config.schema import AlgoConf, BackendConf, ModelConf

BACKEND_NAMES = ("torch", "deepspeed", "fsdp2", "sim")


def build_backend(conf: BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int, *,
                  rank: int | None = None, world_size: int = 1, master_addr: str = "", master_port: int = 0,
                  timeout_s: float = 600.0) -> TrainingBackend:
    """The backend named by `conf.name`; a ranked one (`conf.ranked`) as `rank` of `world_size`, joining
    the process group at rank 0's `master_addr:master_port`. Imports are lazy so `sim` runs never load
    torch models."""
    if conf.name == "sim":
        from rlharness.backend.sim import SimBackend

        return SimBackend(conf)
    if conf.name not in BACKEND_NAMES:
        raise ValueError(f"backend.name={conf.name!r} is not allowed: expected one of {', '.join(BACKEND_NAMES)}")
    from rlharness.backend.learner import Learner

    if not conf.ranked:
        return Learner(conf, model_conf, algo, total_steps, seed)
    if rank is None:
        raise ValueError(f"backend={conf.name} runs as ranks on Ray actors: start it with "
                         f"rlharness.distributed.start_ranked_backend")
    where = dict(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port,
                 timeout_s=timeout_s)
    if conf.name == "deepspeed":
        from rlharness.backend.deepspeed_runner import deepspeed_runners

        runners = deepspeed_runners(conf, model_conf.dtype, **where)
    else:
        from rlharness.backend.fsdp2_runner import fsdp2_runners

        runners = fsdp2_runners(conf, **where)
    return Learner(conf, model_conf, algo, total_steps, seed, runners)


def rank_env(conf: BackendConf) -> dict[str, str]:
    """Environment variables a ranked backend's processes need before they import anything."""
    if conf.name == "deepspeed":
        from rlharness.backend.deepspeed_runner import worker_env

        return worker_env(conf.device)
    return {}


__all__ = ["BACKEND_NAMES", "TrainingBackend", "build_backend", "rank_env"]
