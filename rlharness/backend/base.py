"""The training side: one object per run, local or a proxy to Ray actors.

All methods are async so a local backend, a Ray actor group and the `sim` backend
(which sleeps on the event loop's clock) look the same to the trainer.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from rlharness.core.types import TrainBatch


class TrainingBackend(abc.ABC):
    # After train_step: the mean |engine - trainer| log-prob gap of each batch row, where the backend
    # measures it in this process (None otherwise); names the groups of an on-policy gap (onpolicy_guard.py).
    last_row_gaps: list[float] | None = None

    @abc.abstractmethod
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step (or `algo.mini_batches` of them) on `batch`; returns `train/*` metrics."""

    @abc.abstractmethod
    async def get_weights(self) -> dict[str, Any]:
        """The policy's state dict (CPU tensors) to send to the rollout engines."""

    @abc.abstractmethod
    async def save(self, directory: str) -> None:
        """Write model, optimizer, scheduler and backend RNG state under `directory`."""

    @abc.abstractmethod
    async def load(self, directory: str) -> None:
        """Restore what `save` wrote."""

    async def probe_longest(self, rows: int, prompt_tokens: int, response_tokens: int) -> dict[str, Any] | None:
        """Train once on a synthetic micro-batch of that shape and undo it (`trainer.probe_longest`,
        rlharness/backend/probe.py); None where the backend cannot (the run then says so and goes on)."""
        return None

    def weight_checksums(self) -> dict[str, torch.Tensor] | None:
        """Exact block checksums (`rlharness.weights.transfer.weight_checksums`) of the policy's weights in this
        process (onpolicy_guard.py); None where they are elsewhere (Ray actors) or not what engines get (LoRA)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass
