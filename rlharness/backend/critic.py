"""The critic of `algo.advantage=gae` (algo=ppo): a decoder with a scalar value head, its own optimizer.

The body is the decoder of `algo.critic.path` (default: the policy's `model.path`, the starting
checkpoint, as verl and OpenRLHF initialise theirs); the head is a fresh `Linear(hidden, 1)`
drawn from the run's seed (OpenRLHF's init: normal, std 1 / (hidden + 1), zero bias), so a
critic starts near 0 for every state. The whole critic trains (also when the policy trains
LoRA adapters), with AdamW at `algo.critic.lr` (constant), its own gradient clip; it runs on
the backend's model runner like the policy (rlharness/backend/runner.py: under backend=deepspeed
a ZeRO engine of its own, under backend=fsdp2 sharded), and the learner trains it.

Values are read like log-probs: `values[b, t]` is the head on the hidden state at t - 1, the
state in which token t was chosen. The learner that owns the critic (rlharness/backend/learner.py)
computes them on the batch it trains, at train time, with the critic as it is then: in an async
or disaggregated run the values of a stale sample come from the trainer's current critic, not from
one of the sample's time (the policy's stale log-probs are corrected by the importance weights;
the critic only needs to be the best baseline available).

Its checkpoint (`<backend dir>/critic/`): the weights as `critic.safetensors`, and the runner's own
state (backend=torch and fsdp2: the optimizer in `critic_state.pt`; backend=deepspeed: its
`deepspeed/` folder).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlharness.core.checkpoint import writing
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] float32 values; column t from the hidden state at t - 1 (column 0 is 0). Packed rows
        (`position_ids`, no mask): a sample's first column holds the previous sample's, never a response's."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=False).last_hidden_state
        v = self.value_head(hidden[:, :-1]).squeeze(-1).float()
        return torch.nn.functional.pad(v, (1, 0))


def value_model(conf: CriticConf, model_conf: ModelConf, device: str, seed: int) -> ValueModel:
    """The critic's model, in training mode: the decoder of `critic_model_conf`, a fresh value head."""
    lm = load_model(critic_model_conf(conf, model_conf), device=device)
    hidden = int(lm.config.get_text_config().hidden_size)
    model = ValueModel(lm.get_decoder(), hidden, seed)  # the LM head is dropped with `lm`
    del lm
    return model.train()


def write_weights(state: dict[str, torch.Tensor], directory: Path) -> None:
    with writing(directory / WEIGHTS_FILE):
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / WEIGHTS_FILE))


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / WEIGHTS_FILE))
