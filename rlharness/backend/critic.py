"""The critic of `algo.advantage=gae` (algo=ppo): a decoder with a scalar value head, its own optimizer.

The body is the decoder of `algo.critic.path` (default: the policy's `model.path`, the starting
checkpoint, as verl and OpenRLHF initialise theirs); the head is a fresh `Linear(hidden, 1)`
drawn from the run's seed (OpenRLHF's init: normal, std 1 / (hidden + 1), zero bias), so a
critic starts near 0 for every state. The whole critic trains (also when the policy trains
LoRA adapters), with AdamW at `algo.critic.lr` (constant), its own gradient clip.

Values are read like log-probs: `values[b, t]` is the head on the hidden state at t - 1, the
state in which token t was chosen. The backend that owns the critic (rlharness/backend/
torch_backend.py) computes them on the batch it trains, at train time, with the critic as it
is then: in an async or disaggregated run the values of a stale sample come from the trainer's
current critic, not from one of the sample's time (the policy's stale log-probs are corrected
by the importance weights; the critic only needs to be the best baseline available).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlharness.core.checkpoint import load_state, save_state, writing
from rlharness.config.schema import CriticConf, LoraConf, ModelConf
from rlharness.model.load import load_model

WEIGHTS_FILE = "critic.safetensors"
STATE_FILE = "critic_state.pt"


def critic_model_conf(conf: CriticConf, model_conf: ModelConf) -> ModelConf:
    """The folder the critic's body comes from (`algo.critic.path`, else the policy's), without LoRA."""
    return dataclasses.replace(model_conf, path=conf.path or model_conf.path, lora=LoraConf())


class ValueModel(torch.nn.Module):
    def __init__(self, body: torch.nn.Module, hidden_size: int, seed: int) -> None:
        super().__init__()
        self.body = body
        param = next(body.parameters())
        self.value_head = torch.nn.Linear(hidden_size, 1, device=param.device, dtype=param.dtype)
        gen = torch.Generator(device="cpu").manual_seed(seed)  # the training RNG stream is left alone
        with torch.no_grad():
            w = torch.randn(self.value_head.weight.shape, generator=gen) / (hidden_size + 1)
            self.value_head.weight.copy_(w)
            self.value_head.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] float32 values; column t from the hidden state at t - 1 (column 0 is 0)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        v = self.value_head(hidden[:, :-1]).squeeze(-1).float()
        return torch.nn.functional.pad(v, (1, 0))


class Critic:
    def __init__(self, conf: CriticConf, model_conf: ModelConf, algo_betas: tuple[float, float], device: str,
                 seed: int) -> None:
        self.conf = conf
        lm = load_model(critic_model_conf(conf, model_conf), device=device)
        hidden = int(lm.config.get_text_config().hidden_size)
        self.model = ValueModel(lm.get_decoder(), hidden, seed)  # the LM head is dropped with `lm`
        del lm
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=conf.lr, betas=algo_betas,
                                           weight_decay=conf.weight_decay, fused=False)

    def predict(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """[b, t] values of a micro-batch's response tokens (0 elsewhere), with gradient."""
        return self.model(mb["input_ids"], mb["attention_mask"]) * mb["response_mask"]

    @torch.no_grad()
    def values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.predict(mb)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip, step (skipped on a non-finite norm), zero; returns the gradient norm before clipping."""
        clip = self.conf.grad_clip if self.conf.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def save(self, directory: Path) -> None:
        with writing(directory / WEIGHTS_FILE):
            save_file({k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()},
                      str(directory / WEIGHTS_FILE))
        with writing(directory / STATE_FILE):
            save_state({"optimizer": self.optimizer.state_dict()}, directory / STATE_FILE)

    def load(self, directory: Path) -> None:
        missing = [f for f in (WEIGHTS_FILE, STATE_FILE) if not (directory / f).is_file()]
        if missing:
            raise FileNotFoundError(f"critic checkpoint {directory}: {', '.join(missing)} missing (a checkpoint "
                                    f"of a run without algo.advantage=gae cannot resume as one with a critic)")
        self.model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)), strict=True)
        self.optimizer.load_state_dict(load_state(directory / STATE_FILE)["optimizer"])
        # The optimizer's LR follows this run's algo.critic.lr (as the policy's follows algo.lr).
        for group in self.optimizer.param_groups:
            group["lr"] = self.conf.lr
