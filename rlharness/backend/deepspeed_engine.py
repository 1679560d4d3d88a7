"""What the DeepSpeed policy (deepspeed_backend.py) and critic (deepspeed_critic.py) engines share: their
config, an optimizer step that refuses a non-finite gradient on every rank alike, and their checkpoint's
names and allowed classes."""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlharness.config.schema import AlgoConf, DeepSpeedBackendConf, ModelConf

log = logging.getLogger(__name__)

DS_SUBDIR = "deepspeed"
DS_TAG = "state"


def ds_config(conf: DeepSpeedBackendConf, algo: AlgoConf, model_conf: ModelConf) -> dict[str, Any]:
    return {
        # Batching is ours (TorchBackend's micro-batches); DeepSpeed reduces at `step()`.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(algo.grad_clip),
        "zero_optimization": {"stage": conf.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": model_conf.dtype == "bfloat16"},
        "fp16": {"enabled": model_conf.dtype == "float16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def all_ranks(ok: bool) -> bool:
    """`ok` on every rank (a collective: every rank must call it)."""
    flag = torch.tensor([1.0 if ok else 0.0])
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def step_engine(engine, zero_stage: int, what: str) -> tuple[torch.Tensor, bool]:
    """`engine.step()`: (the gradient norm before clipping, whether the update was skipped).

    ZeRO 1-3 skip an update whose gradient norm is non-finite themselves (`_step_applied`); stage 0
    applies whatever the gradient is, so a non-finite one is refused here, on every rank alike.
    The 2-norm as torch's clipping computes it: also non-finite when finite elements overflow its sum."""
    if zero_stage == 0 and not all_ranks(bool(torch.isfinite(torch.nn.utils.get_total_norm(
            [p.grad for p in engine.module.parameters() if p.grad is not None])))):
        log.warning("%s: non-finite gradient; skipping the optimizer step", what)
        engine.zero_grad()
        return torch.tensor(float("nan")), True
    engine.step()
    skipped = not getattr(engine, "_step_applied", True)
    if skipped:
        log.warning("%s: non-finite gradient; deepspeed skipped the optimizer step", what)
    norm = engine.get_global_grad_norm()
    return torch.tensor(float("nan") if norm is None else float(norm)), skipped


def deepspeed_state_classes() -> tuple[type, ...]:
    """The plain-data classes DeepSpeed's ZeRO optimizer files hold (an enum, a dataclass, the loss
    scaler's attributes): allowed by name, nothing else is (stages 0-3, DeepSpeed 0.19)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return (ZeroStageEnum, fragment_address, LossScaler)
