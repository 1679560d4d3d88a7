"""The seam between the learner (the loss loop, rlharness/backend/learner.py) and the way a model runs.

A `ModelRunner` holds one model (the policy, its frozen reference, or the critic's value model)
with its optimizer, as one training process runs them: plainly (`TorchRunner`, backend=torch), as
a DeepSpeed ZeRO engine (`DeepSpeedRunner`, backend=deepspeed) or sharded by torch's FSDP2
(`FSDP2Runner`, backend=fsdp2). The learner asks a runner only for what differs between them: a
forward to the final hidden states (or the logits), a backward, an optimizer step, the full state
dict (to send to engines, to save) and its checkpoint files. Where a runner is one of several ranks
its methods are collectives: every rank calls them, in the same order.

`Ranks` are the training processes of one backend and the reductions across them (alone: nothing
to reduce); `Runners` is what a process needs to make its runners: its device, its ranks, `make`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rlharness.backend.packing import PackedRows
from rlharness.core.checkpoint import load_state, save_state, writing

log = logging.getLogger(__name__)

# (trainable parameters) -> the optimizer over them
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def adamw(lr: float, betas: tuple[float, float], weight_decay: float) -> OptimizerFactory:
    """torch's AdamW, unfused (DeepSpeed's own fused CPU Adam costs an 80 s JIT compile)."""
    return lambda params: torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=False)


class Ranks:
    """One training process (rank 0 of 1): every reduction is the value itself."""

    rank = 0
    world_size = 1

    def sum_(self, t: torch.Tensor) -> None:
        """Sum `t` over the ranks, in place."""

    def max_(self, t: torch.Tensor) -> None:
        """Maximum of `t` over the ranks, in place."""

    def all_true(self, ok: bool) -> bool:
        return ok

    def barrier(self) -> None:
        pass


class DistributedRanks(Ranks):
    """This process among `world_size` joined in torch.distributed's default group (gloo or NCCL)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def sum_(self, t: torch.Tensor) -> None:
        torch.distributed.all_reduce(t)

    def max_(self, t: torch.Tensor) -> None:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)

    def all_true(self, ok: bool) -> bool:
        flag = torch.tensor([1.0 if ok else 0.0])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item())

    def barrier(self) -> None:
        torch.distributed.barrier()


class ModelRunner(abc.ABC):
    """One model and its optimizer as this process runs them (module docstring)."""

    # The model itself (a transformers model, a PeftModel, the critic's ValueModel): its names, submodules
    # and output head are the model's own, whatever wraps it.
    module: torch.nn.Module
    # The torch optimizer whose param groups carry the learning rate (the LR schedule drives it); None: frozen.
    optimizer: torch.optim.Optimizer | None
    ranks: Ranks
    # Whether `trainer.probe_longest` can step `optimizer` itself at learning rate 0 and undo it
    # (backend/probe.py): not where an engine steps its own (DeepSpeed's ZeRO) or holds shards (FSDP2).
    probes = False

    # ------------------------------------------------------------------ forward
    @abc.abstractmethod
    def forward(self, **inputs: Any) -> Any:
        """The model's forward, through what wraps it (a DeepSpeed engine's bookkeeping, FSDP2's gathers)."""

    def hidden_states(self, ids: torch.Tensor, attn: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        """[B, T, hidden]: the final (normalised) hidden states the output head projects, no logits.
        `extra`: more model inputs (packed rows' `position_ids`)."""
        out = self.forward(input_ids=ids, attention_mask=attn, use_cache=False, output_hidden_states=True,
                           logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids.device), **extra)
        return out.hidden_states[-1]

    def logits(self, ids: torch.Tensor, attn: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        return self.forward(input_ids=ids, attention_mask=attn, use_cache=False, **extra).logits

    def response_rows(self, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor, head_split: bool,
                      packed: PackedRows | None = None) -> tuple[torch.Tensor, torch.nn.Module | None]:
        """The [N, D] rows to score at `positions` ([B, T - 1] bool) and the head that projects them (None:
        they are logits). `head_split`: the output head applied to `hidden_states` gives the logits.
        `packed`: the same rows laid out packed (packing.py); the model runs on those, the rows come back
        in the padded layout's order."""
        if packed is None:
            extra, take = {}, (lambda out: out[:, :-1][positions])
        else:
            ids, attn, extra = packed.input_ids, None, {"position_ids": packed.position_ids}
            take = (lambda out: packed.rows_at(out, positions))
        if head_split:
            return take(self.hidden_states(ids, attn, **extra)), self.module.get_output_embeddings()
        return take(self.logits(ids, attn, **extra)), None

    # ------------------------------------------------------------------ update
    @abc.abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of `loss` (already divided by the whole mini-batch's count; the ranks'
        gradients are summed, not averaged)."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @abc.abstractmethod
    def step(self, what: str) -> tuple[torch.Tensor, bool]:
        """Clip (at the runner's `grad_clip`) and step: (the gradient norm before clipping, whether the
        update was skipped because it is non-finite; then on every rank alike). `what` names it in the log."""

    @abc.abstractmethod
    def all_finite(self) -> bool:
        """No NaN or inf in the model's parameters, on any rank."""

    # ------------------------------------------------------------------ state
    @abc.abstractmethod
    def full_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor] | None:
        """Rank 0: every tensor of `module.state_dict()` whole, a tied one once (under its first name), on
        the CPU; None on other ranks. `copy=False`: the live tensors where they are whole in this process
        (the caller copies them before the next step can change them)."""

    def gathered(self) -> contextlib.AbstractContextManager:
        """A context in which `module`'s parameters are whole (ZeRO-3 and FSDP2 gather them)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def save(self, directory: Path, write_weights: Callable[[dict[str, torch.Tensor]], None], state_file: str,
             extra: dict[str, Any]) -> None:
        """Write what resuming this model needs under `directory`: its weights through `write_weights(full
        state dict)` (called on rank 0), its optimizer, and `extra` (the learner's own state, returned by `load`)."""

    @abc.abstractmethod
    def load(self, directory: Path, read_weights: Callable[[], dict[str, torch.Tensor]], state_file: str,
             strict: bool = True) -> dict[str, Any]:
        """Restore what `save` wrote; returns its `extra`. `read_weights()` reads the weights `write_weights`
        wrote where the runner needs them; `strict=False`: they may be a part (LoRA: the adapters)."""


class FullStateRunner(ModelRunner):
    """A runner whose checkpoints hold whole tensors: the weights through the caller's `write_weights`,
    the optimizer's state in torch's own layout (parameters by index) with `extra` in `state_file`. So
    a checkpoint is the same whichever runner wrote it: backend=torch and backend=fsdp2 resume each other's."""

    @abc.abstractmethod
    def load_full_state_dict(self, state: dict[str, torch.Tensor], strict: bool) -> None:
        """Set the model's weights from whole tensors (every rank passes the same `state`)."""

    @abc.abstractmethod
    def optimizer_state_dict(self) -> dict[str, Any] | None:
        """The optimizer's state in `torch.optim.Optimizer.state_dict()`'s layout, whole, on rank 0 (None elsewhere)."""

    @abc.abstractmethod
    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `optimizer_state_dict` returned (every rank passes it whole)."""

    def save(self, directory: Path, write_weights: Callable[[dict[str, torch.Tensor]], None], state_file: str,
             extra: dict[str, Any]) -> None:
        weights, optimizer = self.full_state_dict(copy=False), self.optimizer_state_dict()
        if self.ranks.rank == 0:
            write_weights(weights)
            with writing(directory / state_file):
                save_state({"optimizer": optimizer, **extra}, directory / state_file)
        self.ranks.barrier()

    def load(self, directory: Path, read_weights: Callable[[], dict[str, torch.Tensor]], state_file: str,
             strict: bool = True) -> dict[str, Any]:
        path = directory / state_file
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {directory}: {state_file} is missing (not written by backend=torch "
                                    f"or backend=fsdp2?)")
        self.load_full_state_dict(read_weights(), strict)
        state = load_state(path)  # data only: a crafted file is refused, never run
        self.load_optimizer_state_dict(state.pop("optimizer"))
        return state


@dataclass(frozen=True)
class Runners:
    """How this training process runs its models: where (`device`), among which processes (`ranks`),
    and `make(module, optimizer=None, grad_clip=0.0)`, which wraps a model (with the optimizer
    `optimizer(trainable parameters)` makes; None: a frozen model) into a `ModelRunner`."""

    device: torch.device
    ranks: Ranks
    make: Callable[..., ModelRunner]


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """No NaN or inf in `tensors`. Their max-abs norms: one fused pass that reads each tensor once,
    never overflows for finite values (a 2-norm would) and is NaN when any element is."""
    tensors = [t.detach() for t in tensors if t.numel() > 0]
    if not tensors:
        return True
    return bool(torch.stack(torch._foreach_norm(tensors, float("inf"))).isfinite().all())


def clip_and_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float,
                  what: str) -> tuple[torch.Tensor, bool]:
    """torch's `clip_grad_norm_` (0: no clip) then the step, skipped (gradients dropped) on a non-finite
    norm. Sharded gradients (FSDP2's DTensors) give the whole model's norm, the same on every rank."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, grad_clip if grad_clip > 0 else float("inf"), norm)
    if not bool(torch.isfinite(norm)):
        log.warning("%s: non-finite grad norm %s; skipping the optimizer step", what, norm)
        optimizer.zero_grad(set_to_none=True)
        return norm, True
    optimizer.step()
    return norm, False
