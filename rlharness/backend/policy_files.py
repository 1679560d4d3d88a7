"""The policy's weights in a checkpoint, whichever runner trained it: a Hugging Face model folder (so
the checkpoint loads as `model.path`), or with LoRA PEFT's adapter folder, and the tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from rlharness.core.checkpoint import writing
from rlharness.model import lora

MODEL_WEIGHTS = "model.safetensors"


def write_policy(model: torch.nn.Module, tokenizer, state: dict[str, torch.Tensor], out: Path, adapter: bool) -> None:
    """`model.save_pretrained` of `state` (the whole state dict; with `adapter`, PEFT keeps the adapters)."""
    with writing(out / (lora.ADAPTER_WEIGHTS if adapter else MODEL_WEIGHTS)):
        model.save_pretrained(out, state_dict=state)
    with writing(out / "tokenizer.json"):
        tokenizer.save_pretrained(out)


def read_policy(peft_model, src: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What `write_policy` wrote, under the model's parameter names: the whole state dict, or the adapters."""
    if peft_model is not None:
        return lora.adapter_state(peft_model, src)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype).state_dict()
