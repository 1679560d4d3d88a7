"""`backend=fsdp2`: a model sharded across the ranks by torch's FSDP2 (`torch.distributed.fsdp.fully_shard`).

As verl, torchtitan and the others apply it: `fully_shard` on each transformer block (the classes a
transformers model lists in `_no_split_modules`) and then on the whole model (the root: embeddings,
final norm, output head). Each rank keeps 1/W of every parameter, gradient and AdamW state; a
block's parameters are all-gathered for its forward (freed after it with
`backend.reshard_after_forward`) and again for its backward, and its gradients are reduce-scattered.
The root's are not freed after the forward (FSDP2's rule for the root), so the learner applies the
output head to the response positions chunk by chunk outside the forward, as for backend=torch.
Gradients are summed across ranks, not averaged (divide factor 1, SUM reductions: gloo has no
pre-multiplied sum), because the learner divides each micro-batch's loss by the whole mini-batch's
count. Gradient clipping takes the whole model's norm (the shards' norms combined), the same on
every rank, so a non-finite one skips the update everywhere. Parameters keep the model's dtype
(`model.dtype`; no mixed-precision policy). The frozen reference model and the critic (algo=ppo)
are sharded the same way, each with its own groups.

Weights to engines and checkpoints are whole tensors (`get_model_state_dict` /
`get_optimizer_state_dict` with `full_state_dict`, gathered to rank 0 on the CPU): the checkpoint
is backend=torch's (a Hugging Face folder, the optimizer in torch's layout in the state file), so
either backend resumes the other's. On a resume every rank reads the files and keeps its shards.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any, Iterator

import torch

from rlharness.backend.learner import Learner
from rlharness.backend.runner import (DistributedRanks, FullStateRunner, OptimizerFactory, Runners, all_finite,
                                      clip_and_step)
from rlharness.config.schema import AlgoConf, FSDP2BackendConf, ModelConf

log = logging.getLogger(__name__)


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules of the classes its transformers models name in
    `_no_split_modules` (the field's FSDP wrap policy: verl, accelerate)."""
    names: set[str] = set()
    for m in module.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    return [m for m in module.modules() if type(m).__name__ in names]


def tied_aliases(module: torch.nn.Module) -> set[str]:
    """Names of parameters that are another one under a second name (a tied LM head), first name kept."""
    seen: set[int] = set()
    aliases: set[str] = set()
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        seen.add(id(p))
    return aliases


def by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (torch.distributed.checkpoint's) in
    `torch.optim.Optimizer.state_dict()`'s layout: parameters numbered in their order in the param groups."""
    index = {name: i for i, name in enumerate(n for g in state["param_groups"] for n in g["params"])}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


def by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`by_index` undone: `names` are the optimizer's parameters' names, in its order."""
    return {"state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


class FSDP2Runner(FullStateRunner):
    def __init__(self, module: torch.nn.Module, optimizer: OptimizerFactory | None = None, grad_clip: float = 0.0, *,
                 mesh: Any, reshard_after_forward: bool, ranks: DistributedRanks) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self.grad_clip, self.ranks = grad_clip, ranks
        self._aliases = tied_aliases(module)
        for block in transformer_blocks(module):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        self.module = fully_shard(module, mesh=mesh)
        self._sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
        for m in self._sharded:
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
        self._names = [n for n, p in module.named_parameters() if p.requires_grad]  # the optimizer's order
        self.optimizer = optimizer(self._trainable()) if optimizer is not None else None

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def forward(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, what: str) -> tuple[torch.Tensor, bool]:
        return clip_and_step(self._trainable(), self.optimizer, self.grad_clip, what)

    def all_finite(self) -> bool:
        """Every rank's shards finite."""
        return self.ranks.all_true(all_finite([p.to_local() for p in self.module.parameters()]))

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        for m in self._sharded:
            m.unshard()
        try:
            yield
        finally:
            for m in self._sharded:
                m.reshard()

    def _reshard(self) -> None:
        """Register the shards again where a forward left whole parameters (the root's after a forward
        without backward): state dicts are read and set through the shards."""
        for m in self._sharded:
            m.reshard()

    def _options(self, **kw: Any):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def full_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self._reshard()
        state = get_model_state_dict(self.module, options=self._options(cpu_offload=True))
        if self.ranks.rank != 0:
            return None
        return {k: v for k, v in state.items() if k not in self._aliases}

    def load_full_state_dict(self, state: dict[str, torch.Tensor], strict: bool) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        self._reshard()
        set_model_state_dict(self.module, state, options=self._options(strict=strict))

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        self._reshard()
        state = get_optimizer_state_dict(self.module, self.optimizer, options=self._options(cpu_offload=True))
        return by_index(state) if self.ranks.rank == 0 else None

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        self._reshard()
        set_optimizer_state_dict(self.module, self.optimizer, by_name(state, self._names), options=self._options())


def fsdp2_runners(conf: FSDP2BackendConf, *, rank: int, world_size: int, master_addr: str, master_port: int,
                  timeout_s: float = 600.0) -> Runners:
    """Join the ranks' process group (gloo on CPU, NCCL on GPUs; rank 0's address is the rendezvous)
    and their one-dimensional device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    on_cpu = conf.device == "cpu"
    device = torch.device("cpu") if on_cpu else torch.device("cuda", 0)  # a Ray actor sees its one GPU as cuda:0
    if not on_cpu:
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("gloo" if on_cpu else "nccl", init_method=f"tcp://{master_addr}:{master_port}",
                                         rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    mesh = init_device_mesh(device.type, (world_size,))
    ranks = DistributedRanks(rank, world_size)

    def make(module: torch.nn.Module, optimizer: OptimizerFactory | None = None, grad_clip: float = 0.0):
        return FSDP2Runner(module, optimizer, grad_clip, mesh=mesh, reshard_after_forward=conf.reshard_after_forward,
                           ranks=ranks)

    log.info("fsdp2 rank %d/%d up (%s)", rank, world_size, "gloo" if on_cpu else "nccl")
    return Runners(device, ranks, make)


def fsdp2_learner(conf: FSDP2BackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int,
                  seed: int, **rank: Any) -> Learner:
    """One rank of backend=fsdp2 (rlharness/config/registry.py): the learner over its runners; `rank`:
    this rank's `rank`, `world_size`, `master_addr`, `master_port`, `timeout_s`."""
    return Learner(conf, model_conf, algo, total_steps, seed, fsdp2_runners(conf, **rank))
