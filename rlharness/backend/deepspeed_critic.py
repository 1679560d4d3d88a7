"""The critic of algo=ppo under `backend=deepspeed`: the same value model, as a DeepSpeed engine of its own.

Each rank builds the torch backend's `Critic` (rlharness/backend/critic.py: the decoder of
`algo.critic.path` or the policy's checkpoint, the seeded value head, AdamW at `algo.critic.lr`)
and hands model and optimizer to `deepspeed.initialize` with the policy's ZeRO stage and dtype
but its own gradient clip (`algo.critic.grad_clip`). The rank's backend (DeepSpeedWorker) decides
which rows each rank scores and trains; here only what an engine changes: the forward goes
through the engine (ZeRO-3 gathers the parameters), the backward is the engine's, scaled by the
world size like the policy's (DeepSpeed averages gradients over ranks, the loss is already
divided by the whole mini-batch's tokens), and the step is the engine's.

Checkpoint (`<backend dir>/critic/`): DeepSpeed's own under `deepspeed/` (every rank: weights,
optimizer partitions), and from rank 0 a copy of the weights as `critic.safetensors`, the name
backend=torch uses, to read or compare without DeepSpeed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from rlharness.backend.critic import WEIGHTS_FILE, Critic
from rlharness.backend.deepspeed_engine import DS_SUBDIR, DS_TAG, deepspeed_state_classes, ds_config, step_engine
from rlharness.core.checkpoint import check_state_files, writing
from rlharness.config.schema import AlgoConf, CriticConf, DeepSpeedBackendConf, ModelConf


class DeepSpeedCritic(Critic):
    def __init__(self, conf: CriticConf, model_conf: ModelConf, algo: AlgoConf, backend: DeepSpeedBackendConf,
                 seed: int, world_size: int, device: str) -> None:
        import deepspeed

        super().__init__(conf, model_conf, (algo.adam_beta1, algo.adam_beta2), device, seed)
        self.zero_stage, self.world_size = backend.zero_stage, world_size
        config = {**ds_config(backend, algo, model_conf), "gradient_clipping": float(conf.grad_clip)}
        self.engine, _, _, _ = deepspeed.initialize(model=self.model, optimizer=self.optimizer, config=config)
        self.module = self.model
        self.model = self.engine  # `predict` runs the engine's forward

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self) -> float:
        norm, _ = step_engine(self.engine, self.zero_stage, "critic")
        return float(norm)

    def _gathered(self):
        if self.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def weights(self, rank: int) -> dict[str, torch.Tensor] | None:
        """The full state dict on rank 0, None elsewhere (every rank must call: ZeRO-3 gathers)."""
        with self._gathered():
            if rank != 0:
                return None
            return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.module.state_dict().items()}

    def save(self, directory: Path, rank: int = 0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        with writing(directory / DS_SUBDIR):
            self.engine.save_checkpoint(str(directory / DS_SUBDIR), tag=DS_TAG, save_latest=False)
        state = self.weights(rank)
        if state is not None:
            with writing(directory / WEIGHTS_FILE):
                save_file(state, str(directory / WEIGHTS_FILE))

    def load(self, directory: Path) -> None:
        src = directory / DS_SUBDIR
        if not (src / DS_TAG).is_dir():
            raise FileNotFoundError(f"critic checkpoint {directory}: {DS_SUBDIR}/{DS_TAG}/ is missing (a checkpoint "
                                    f"of a run without algo.advantage=gae cannot resume as one with a critic)")
        check_state_files(src, allow=deepspeed_state_classes())  # data only, before DeepSpeed unpickles
        path, _ = self.engine.load_checkpoint(str(src), tag=DS_TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise RuntimeError(f"deepspeed could not load the critic checkpoint in {src}")
        # The optimizer's LR follows this run's algo.critic.lr (as the policy's follows algo.lr).
        for group in self.optimizer.param_groups:
            group["lr"] = self.conf.lr
