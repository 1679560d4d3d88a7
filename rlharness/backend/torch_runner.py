"""`backend=torch`: a model runs as it is, in this one process (the default).

Its checkpoints are whole tensors (`FullStateRunner`): the learner writes the weights (a Hugging
Face folder, a LoRA adapter, the critic's safetensors), the optimizer's state goes into the state
file in torch's layout. backend=deepspeed also runs its frozen reference model this way, on each rank.
"""

from __future__ import annotations

from typing import Any

import torch

from rlharness.backend.runner import (FullStateRunner, OptimizerFactory, Ranks, Runners, all_finite,
                                      clip_and_step)
from rlharness.backend.token_scores import decoder_hidden_states
from rlharness.config.schema import TorchBackendConf
from rlharness.weights.transfer import tied_once


class TorchRunner(FullStateRunner):
    probes = True

    def __init__(self, module: torch.nn.Module, optimizer: OptimizerFactory | None = None, grad_clip: float = 0.0,
                 ranks: Ranks | None = None) -> None:
        self.module, self.grad_clip, self.ranks = module, grad_clip, ranks or Ranks()
        self.optimizer = optimizer(self._trainable()) if optimizer is not None else None

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def forward(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def hidden_states(self, ids: torch.Tensor, attn: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        return decoder_hidden_states(self.module, ids, attn, **extra)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, what: str) -> tuple[torch.Tensor, bool]:
        return clip_and_step(self._trainable(), self.optimizer, self.grad_clip, what)

    def all_finite(self) -> bool:
        return all_finite(list(self.module.parameters()))

    def full_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor]:
        live = tied_once(self.module.state_dict().items())
        if not copy:
            return {name: t.detach() for name, t in live.items()}
        return {name: t.detach().to("cpu", copy=True) for name, t in live.items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor], strict: bool) -> None:
        self.module.load_state_dict(state, strict=strict)

    def optimizer_state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def torch_runners(conf: TorchBackendConf) -> Runners:
    """One process on `backend.device`."""
    return Runners(torch.device(conf.device), Ranks(), TorchRunner)
