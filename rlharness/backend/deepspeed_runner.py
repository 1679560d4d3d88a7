"""`backend=deepspeed`: a model runs as a DeepSpeed ZeRO engine (stages 0-3), one per rank.

The learner (learner.py) trains each rank's share of the batch; here only what an engine
changes: the forward goes through the engine (its backward bookkeeping hooks on the outputs;
ZeRO-3 gathers the parameters), the backward is `engine.backward` with the loss multiplied by
the world size (DeepSpeed averages gradients over ranks; the loss is already divided by the whole
mini-batch's count, so the update equals the one-process one), and the step is `engine.step`
(unmanaged gradient accumulation: reduction, clipping and the AdamW step at `step`). The policy and
the critic (algo=ppo) are engines of their own (the critic with its own clip); the frozen reference
model is not wrapped (each rank holds it whole and scores its own rows: `TorchRunner`).

The optimizer is a plain `torch.optim.AdamW` (DeepSpeed's fused CPU Adam costs an
80 s JIT compile). On CPU the gloo backend is used, and DeepSpeed's shared-memory
all-reduce op (only used by inference all-reduce; ~45 s JIT compile at the first
`init_distributed`) is marked unavailable so it is never built; JIT extensions that
are built go to a stable `TORCH_EXTENSIONS_DIR` (~/.cache/rlharness/torch_extensions).

Checkpoints: DeepSpeed's own under `<dir>/deepspeed/` (every rank: weights, optimizer partitions, the
learner's state as client state) and from rank 0 a whole copy of the weights the way the learner
writes them (a Hugging Face folder for the policy, so the same `resume=` path as backend=torch works
and the folder loads as a model; `critic.safetensors` for the critic). DeepSpeed's checkpoint engine
unpickles with weights_only=False: every file is read with the data-only loader first.
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from rlharness.backend.learner import Learner
from rlharness.backend.packing import PackedRows
from rlharness.backend.runner import (DistributedRanks, ModelRunner, OptimizerFactory, Runners, all_finite)
from rlharness.backend.torch_runner import TorchRunner
from rlharness.core.checkpoint import check_state_files, writing
from rlharness.config.schema import AlgoConf, DeepSpeedBackendConf, ModelConf
from rlharness.weights.transfer import tied_once

log = logging.getLogger(__name__)

DS_SUBDIR = "deepspeed"
DS_TAG = "state"


def torch_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "rlharness" / "torch_extensions")


def worker_env(device: str) -> dict[str, str]:
    """Environment a DeepSpeed worker process needs before `import deepspeed`."""
    return {"DS_ACCELERATOR": "cpu" if device == "cpu" else "cuda",
            "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}


def ds_config(conf: DeepSpeedBackendConf, grad_clip: float, dtype: str) -> dict[str, Any]:
    return {
        # Batching is the learner's (its micro-batches); DeepSpeed reduces at `step()`.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(grad_clip),
        "zero_optimization": {"stage": conf.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def deepspeed_state_classes() -> tuple[type, ...]:
    """The plain-data classes DeepSpeed's ZeRO optimizer files hold (an enum, a dataclass, the loss
    scaler's attributes): allowed by name, nothing else is (stages 0-3, DeepSpeed 0.19)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return (ZeroStageEnum, fragment_address, LossScaler)


class DeepSpeedRunner(ModelRunner):
    def __init__(self, module: torch.nn.Module, optimizer: OptimizerFactory, grad_clip: float, *,
                 conf: DeepSpeedBackendConf, dtype: str, ranks: DistributedRanks) -> None:
        import deepspeed

        self.zero_stage, self.ranks = conf.zero_stage, ranks
        self.optimizer = optimizer([p for p in module.parameters() if p.requires_grad])
        self.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=self.optimizer,
                                                    config=ds_config(conf, grad_clip, dtype))
        self.module = self.engine.module

    def forward(self, **inputs: Any) -> Any:
        return self.engine(**inputs)

    def response_rows(self, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor, head_split: bool,
                      packed: PackedRows | None = None) -> tuple[torch.Tensor, torch.nn.Module | None]:
        """ZeRO-3 gathers the head's weight collectively at every call of the head, and ranks hold
        different numbers of response tokens (so of chunks): there the model projects the response
        positions itself, in its one head call, and only the log-softmax is chunked (packed rows: all
        their positions, then the response rows are taken)."""
        if self.zero_stage != 3:
            return super().response_rows(ids, attn, positions, head_split, packed)
        if packed is not None:
            return packed.rows_at(self.engine(**packed.forward_inputs()).logits, positions), None
        keep = torch.nn.functional.pad(positions, (0, 1))  # [B, T]: hidden state t - 1 scores token t
        return self.engine(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep).logits, None

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.ranks.world_size, scale_wrt_gas=False)

    def step(self, what: str) -> tuple[torch.Tensor, bool]:
        """`engine.step()`. ZeRO 1-3 skip an update whose gradient norm is non-finite themselves
        (`_step_applied`); stage 0 applies whatever the gradient is, so a non-finite one is refused here,
        on every rank alike. The 2-norm as torch's clipping computes it: also non-finite when finite
        elements overflow its sum."""
        engine = self.engine
        if self.zero_stage == 0 and not self.ranks.all_true(bool(torch.isfinite(torch.nn.utils.get_total_norm(
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

    def all_finite(self) -> bool:
        """Every rank's parameters finite (ZeRO-3: each rank's own partition, `ds_tensor`)."""
        return self.ranks.all_true(all_finite([getattr(p, "ds_tensor", p) for p in self.module.parameters()]))

    def gathered(self) -> contextlib.AbstractContextManager:
        if self.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def full_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor] | None:
        with self.gathered():
            if self.ranks.rank != 0:
                return None
            return {k: v.detach().to("cpu", copy=True) for k, v in tied_once(self.module.state_dict().items()).items()}

    def save(self, directory: Path, write_weights: Callable[[dict[str, torch.Tensor]], None], state_file: str,
             extra: dict[str, Any]) -> None:
        """DeepSpeed's checkpoint (`extra` as its client state; frozen parameters, LoRA's base, left out),
        then the whole weights from rank 0. `state_file` is unused: the state is DeepSpeed's folder."""
        frozen = any(not p.requires_grad for p in self.module.parameters())
        with writing(directory / DS_SUBDIR):
            self.engine.save_checkpoint(str(directory / DS_SUBDIR), tag=DS_TAG, save_latest=False, client_state=extra,
                                        exclude_frozen_parameters=frozen)
        weights = self.full_state_dict()
        if weights is not None:
            write_weights(weights)
        self.ranks.barrier()

    def load(self, directory: Path, read_weights: Callable[[], dict[str, torch.Tensor]], state_file: str,
             strict: bool = True) -> dict[str, Any]:
        """DeepSpeed's checkpoint (the whole weights it also wrote are not read back)."""
        src = directory / DS_SUBDIR
        if not (src / DS_TAG).is_dir():
            raise FileNotFoundError(f"checkpoint {directory}: {DS_SUBDIR}/{DS_TAG}/ is missing (not written by "
                                    f"backend=deepspeed?)")
        # DeepSpeed's checkpoint engine unpickles with weights_only=False: read every file
        # with the data-only loader first, so a crafted file is refused before it can run.
        check_state_files(src, allow=deepspeed_state_classes())
        path, client = self.engine.load_checkpoint(str(src), tag=DS_TAG, load_optimizer_states=True,
                                                   load_lr_scheduler_states=False, load_module_strict=strict)
        if path is None:
            raise RuntimeError(f"deepspeed could not load the checkpoint in {src}")
        return client


def _skip_shm_comm_build() -> None:
    """Training never uses DeepSpeed's CPU shm all-reduce (torch.distributed/gloo does the work)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_runners(conf: DeepSpeedBackendConf, dtype: str, *, rank: int, world_size: int, master_addr: str,
                      master_port: int, timeout_s: float = 600.0) -> Runners:
    """Join the ranks' process group (gloo on CPU, NCCL on GPUs; rank 0's address is the rendezvous)."""
    on_cpu = conf.device == "cpu"
    os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank if on_cpu else 0),
                       **worker_env(conf.device)})
    import deepspeed

    if on_cpu:
        _skip_shm_comm_build()
    deepspeed.init_distributed(dist_backend="gloo" if on_cpu else "nccl", auto_mpi_discovery=False,
                               timeout=timedelta(seconds=timeout_s), verbose=False)
    ranks = DistributedRanks(rank, world_size)

    def make(module: torch.nn.Module, optimizer: OptimizerFactory | None = None, grad_clip: float = 0.0):
        if optimizer is None:  # a frozen model: each rank holds it whole
            return TorchRunner(module, ranks=ranks)
        return DeepSpeedRunner(module, optimizer, grad_clip, conf=conf, dtype=dtype, ranks=ranks)

    log.info("deepspeed rank %d/%d up (ZeRO-%d, %s)", rank, world_size, conf.zero_stage, "gloo" if on_cpu else "nccl")
    return Runners(torch.device("cpu" if on_cpu else "cuda"), ranks, make)


def deepspeed_learner(conf: DeepSpeedBackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int,
                      seed: int, **rank: Any) -> Learner:
    """One rank of backend=deepspeed (rlharness/config/registry.py): the learner over its runners; `rank`:
    this rank's `rank`, `world_size`, `master_addr`, `master_port`, `timeout_s`."""
    return Learner(conf, model_conf, algo, total_steps, seed, deepspeed_runners(conf, model_conf.dtype, **rank))
