"""`backend=sim`: a training side that costs time on the event loop's clock, not compute.

`train_step` sleeps `step_time_s + time_per_token_s * response tokens` and returns
what can honestly be computed from the batch alone. These are SIM metrics: no model
is trained, so the loss is the policy-gradient surrogate at ratio 1 computed from
the rollout log-probs, there is no reference (kl = 0), no gradient (grad_norm = 0)
and no ratio drift (clip_frac = 0).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from rlharness.backend.base import TrainingBackend
from rlharness.core.checkpoint import writing
from rlharness.config.schema import SimBackendConf
from rlharness.core.types import TrainBatch

_STATE_FILE = "sim_backend.json"


class SimBackend(TrainingBackend):
    def __init__(self, conf: SimBackendConf, *run: Any) -> None:
        """`run` (the model, algorithm, steps and seed a real backend takes) means nothing to a simulation."""
        self.conf = conf
        self.version = 0  # weight version: number of train steps taken
        self.tokens_trained = 0

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        mask = batch.response_mask.float()
        tokens = int(mask.sum().item())
        await asyncio.sleep(self.conf.step_time_s + self.conf.time_per_token_s * tokens)
        denom = max(tokens, 1)
        # Sim: surrogate -A * logp_rollout, token mean (ratio 1, nothing to clip).
        loss = float((-(batch.advantages * batch.rollout_logprobs) * mask).sum().item()) / denom
        # Sim: sampled-token estimate of entropy, -mean log p of the tokens drawn.
        entropy = float((-batch.rollout_logprobs * mask).sum().item()) / denom
        self.version += 1
        self.tokens_trained += tokens
        return {
            "train/loss": loss,
            "train/kl": 0.0,
            "train/entropy": entropy,
            "train/grad_norm": 0.0,
            "train/clip_frac": 0.0,
            "train/tokens": float(tokens),
        }

    async def get_weights(self) -> dict[str, Any]:
        return {"sim_version": self.version}

    async def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, _STATE_FILE)
        tmp = path + ".tmp"
        with writing(path), open(tmp, "w") as f:
            json.dump({"version": self.version, "tokens_trained": self.tokens_trained}, f)
        os.replace(tmp, path)

    async def load(self, directory: str) -> None:
        path = os.path.join(directory, _STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"sim backend: no {_STATE_FILE} in checkpoint directory {directory}")
        with open(path) as f:
            state = json.load(f)
        self.version = int(state["version"])
        self.tokens_trained = int(state["tokens_trained"])
