"""LoRA through peft: wrapping the policy, the reference without adapters, what engines receive, checkpoints.

`model.lora.rank > 0` turns it on (`LoraConf`). The trainer's model becomes a
`peft.PeftModel` whose only trainable parameters are the adapters' A and B matrices;
the frozen base stays as loaded from `model.path`, so:

- the reference policy of the KL term is the same model under `disable_adapter()`
  (no second copy of the weights);
- engines need only what changed: `sync=merged` sends `W + scale * B @ A` for the
  adapted matrices, under the base model's names (the first sync of a trainer process
  also sends everything else, once); `sync=adapter` sends the A and B tensors under the
  names of a peft-wrapped model, and the engine applies them in its forward
  (`wrap_for_engine` for engine=hf, a PEFT folder per version for engine=vllm);
- a checkpoint holds the adapter in PEFT's own format (`adapter_config.json` +
  `adapter_model.safetensors`, written by `PeftModel.save_pretrained` from the learner's whole state
  dict, rlharness/backend/policy_files.py), loadable with `peft.PeftModel.from_pretrained` on the
  base; `merged_model_from_checkpoint` turns it into an ordinary model (export).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator

import torch

from rlharness.config.schema import ConfigError, LoraConf, ModelConf

log = logging.getLogger(__name__)

# The attention and MLP projections of Llama / Qwen2 / Mistral layouts.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_NAME = "default"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


# ----------------------------------------------------------------------------- targets
def linear_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the model's linear layers."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _matches(name: str, target: str) -> bool:
    # peft's rule for a list of targets: the full name, or its ending after a dot.
    return name == target or name.endswith("." + target)


def resolve_targets(model: torch.nn.Module, conf: LoraConf) -> list[str]:
    """The target list for peft; a target that matches no linear layer is refused, listing those that exist."""
    names = linear_names(model)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
    if not conf.target_modules:
        found = [t for t in DEFAULT_TARGETS if any(_matches(n, t) for n in names)]
        if not found:
            raise ConfigError(f"model.lora.target_modules: none of the default targets ({', '.join(DEFAULT_TARGETS)}) "
                              f"is in this model; its linear layers are: {', '.join(kinds)}")
    else:
        found = list(conf.target_modules)
        for t in found:
            if not any(_matches(n, t) for n in names):
                raise ConfigError(f"model.lora.target_modules: {t!r} matches no module; the model's linear layers "
                                  f"are: {', '.join(kinds)}")
    check_rank_fits(model, found, conf.rank)
    return found


def check_rank_fits(model: torch.nn.Module, targets: list[str], rank: int) -> None:
    """A LoRA update B @ A of rank r has r <= min(in, out) of the layer it adapts: a larger rank only adds
    parameters that cannot change the update (and memory), so it is refused, naming the smallest layer."""
    layers = [(min(m.in_features, m.out_features), n) for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and any(_matches(n, t) for t in targets)]
    smallest, name = min(layers)
    if rank > smallest:
        raise ConfigError(f"model.lora.rank={rank} is not allowed: the adapted layer {name} is "
                          f"{smallest} wide (min of its input and output features), and a rank above that "
                          f"cannot change its update; use model.lora.rank <= {smallest}")


def targets_for(model_conf: ModelConf) -> list[str]:
    """`resolve_targets` on the layout of `model.path` (a weightless copy on the meta device)."""
    from transformers import AutoModelForCausalLM

    from rlharness.model.load import load_model_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(load_model_config(model_conf),
                                                 trust_remote_code=model_conf.trust_remote_code)
    return resolve_targets(model, model_conf.lora)


def check_model_conf(model_conf: ModelConf) -> None:
    """Before anything starts: the LoRA targets exist in `model.path`."""
    if model_conf.lora.enabled:
        targets_for(model_conf)


def peft_config(conf: LoraConf, targets: list[str]):
    from peft import LoraConfig

    return LoraConfig(r=conf.rank, lora_alpha=conf.alpha, lora_dropout=conf.dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM")


# ----------------------------------------------------------------------------- the trainer's model
def wrap(model: torch.nn.Module, conf: LoraConf, gradient_checkpointing: bool = False):
    """The policy as a PeftModel: base frozen, adapters trainable. Logs the parameter counts."""
    from peft import get_peft_model

    targets = resolve_targets(model, conf)
    peft_model = get_peft_model(model, peft_config(conf, targets))
    if gradient_checkpointing:  # frozen embeddings: checkpointed blocks need inputs that require grad
        peft_model.enable_input_require_grads()
    trainable, total = parameter_counts(peft_model)
    log.info("LoRA rank %d alpha %g on %s: %d trainable of %d parameters (%.2f%%)", conf.rank, conf.alpha,
             ", ".join(targets), trainable, total, 100.0 * trainable / max(total, 1))
    return peft_model


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def targets_of(peft_model) -> list[str] | None:
    """The module names a wrapped model's adapters target (None for no LoRA)."""
    if peft_model is None:
        return None
    return sorted(peft_model.peft_config[ADAPTER_NAME].target_modules)


def reference(peft_model) -> contextlib.AbstractContextManager:
    """The starting policy: the same model with its adapters switched off."""
    return peft_model.disable_adapter()


def _inner(peft_model) -> torch.nn.Module:
    """The transformers model inside a PeftModel, adapter layers injected (its names are the engine's)."""
    return peft_model.base_model.model


def _lora_layers(peft_model) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in _inner(peft_model).named_modules():
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
            yield name, module


def _inner_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PeftModel's state dict under the names of the transformers model inside it (`_inner`)."""
    prefix = "base_model.model."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def merged_weights(peft_model, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """`W + scale * B @ A` for each adapted matrix under the base model's names (read from the model's
    adapter layers: their parameters must be whole here); with `state` (the PeftModel's whole state dict,
    a tied head once: the first sync), also every other tensor of the model, as a full-weight run sends."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, value in _inner_state(state or {}).items():
            if "lora_" not in key:
                out[key.replace(".base_layer.", ".")] = value.detach().to("cpu", copy=True)
        for name, module in _lora_layers(peft_model):
            base = module.get_base_layer().weight
            out[f"{name}.weight"] = (base + module.get_delta_weight(ADAPTER_NAME).to(base.dtype)).detach().to(
                "cpu", copy=True)
    return out


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The A and B matrices of a PeftModel's whole state dict, under the names of a peft-wrapped engine
    model (`wrap_for_engine`)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in _inner_state(state).items()
            if ".lora_A." in k or ".lora_B." in k}


class WeightSync:
    """What the trainer sends at each sync, for `model.lora.sync`."""

    def __init__(self, conf: LoraConf) -> None:
        self.conf = conf
        self._sent_base = False

    def begin(self) -> bool:
        """Start a sync; whether it is made from the model's whole state dict (the adapters; the first
        merged sync, which sends everything). Every training rank calls it, so they agree on the next."""
        if self.conf.sync == "adapter":
            return True
        first, self._sent_base = not self._sent_base, True
        return first

    def weights(self, peft_model, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """This sync's tensors; `state`: the PeftModel's whole state dict where `begin()` said so, else None."""
        if self.conf.sync == "adapter":
            return adapter_weights(state)
        return merged_weights(peft_model, state)


# ----------------------------------------------------------------------------- engines
def wrap_for_engine(model: torch.nn.Module, model_conf: ModelConf) -> torch.nn.Module:
    """An engine's model with (zero) adapters injected, so `adapter_weights` names load into it.

    Returns the transformers model (not the PeftModel wrapper): the engine calls it as before.
    The adapters' random init must not move the process's RNG (colocated, the trainer shares it).
    """
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        peft_model = get_peft_model(model, peft_config(model_conf.lora, resolve_targets(model, model_conf.lora)))
    for _, module in _lora_layers(peft_model):  # identity until the first sync
        torch.nn.init.zeros_(module.lora_B[ADAPTER_NAME].weight)
    return _inner(peft_model)


def engine_serves_adapter(model_conf: ModelConf) -> bool:
    return model_conf.lora.enabled and model_conf.lora.sync == "adapter"


def write_adapter_folder(state: dict[str, torch.Tensor], model_conf: ModelConf, folder: str | Path,
                         targets: list[str]) -> Path:
    """The adapter tensors an engine received, as a PEFT folder (what vLLM's LoRARequest loads)."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    peft_config(model_conf.lora, targets).save_pretrained(str(out))
    # PEFT's file names: no adapter name, under the PeftModel's prefix.
    tensors = {"base_model.model." + k.replace(f".{ADAPTER_NAME}.", "."): v.contiguous() for k, v in state.items()}
    save_file(tensors, str(out / ADAPTER_WEIGHTS))
    return out


# ----------------------------------------------------------------------------- checkpoints
def saved_lora(directory: str | Path) -> dict[str, Any] | None:
    """The LoRA settings a checkpoint was written with, or None for a full-weight checkpoint."""
    path = Path(directory) / ADAPTER_CONFIG
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    targets = raw.get("target_modules") or []
    return {"rank": raw.get("r"), "alpha": raw.get("lora_alpha"),
            "target_modules": sorted(targets if isinstance(targets, list) else [targets])}


def check_resume(directory: str | Path, conf: LoraConf, targets: list[str] | None) -> None:
    """Refuse resuming a LoRA checkpoint without LoRA (or the reverse), or with another rank or targets."""
    from rlharness.core.checkpoint import CheckpointError

    saved = saved_lora(directory)
    now = None if not conf.enabled else {"rank": conf.rank, "target_modules": sorted(targets or [])}
    if saved is None and now is None:
        return
    if saved is None:
        raise CheckpointError(f"checkpoint {directory}: written by a full-weight run (model.lora.rank=0), this run has "
                              f"model.lora.rank={conf.rank}: resume it with model.lora.rank=0 or start a new run")
    if now is None:
        raise CheckpointError(f"checkpoint {directory}: written by a LoRA run (model.lora.rank={saved['rank']}, "
                              f"target_modules={saved['target_modules']}), this run has model.lora.rank=0")
    if saved["rank"] != now["rank"] or saved["target_modules"] != now["target_modules"]:
        raise CheckpointError(
            f"checkpoint {directory}: LoRA rank {saved['rank']} on {saved['target_modules']}, this run asks for "
            f"rank {now['rank']} on {now['target_modules']}: resume with the checkpoint's model.lora settings")


def adapter_state(peft_model, directory: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors PEFT saved in `directory`, under the wrapped model's own parameter names (to
    load bit for bit with `load_state_dict(strict=False)`); refused unless they are exactly its adapters."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(directory) / ADAPTER_WEIGHTS))
    # PEFT's file names leave out the adapter's name (get_peft_model_state_dict).
    names = {name.replace(f".{ADAPTER_NAME}", ""): name for name, _ in peft_model.named_parameters()
             if "lora_" in name}
    missing = [k for k in names if k not in saved]
    unexpected = [k for k in saved if k not in names]
    if missing or unexpected:
        raise ValueError(f"adapter in {directory} does not fit the model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return {names[k]: v for k, v in saved.items()}


def is_lora_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def merged_model_from_checkpoint(directory: str | Path, base_path: str | Path, dtype: torch.dtype = torch.float32):
    """An ordinary transformers model: the base at `base_path` with the adapter saved in `directory`
    (a checkpoint's `backend/` folder) merged into its weights. For export: `.save_pretrained(out)`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=dtype)
    return PeftModel.from_pretrained(base, str(directory)).merge_and_unload()


def merged_state_dict_from_checkpoint(directory: str | Path, base_path: str | Path,
                                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The merged model's full state dict (see `merged_model_from_checkpoint`)."""
    return merged_model_from_checkpoint(directory, base_path, dtype).state_dict()
