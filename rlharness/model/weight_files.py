"""The weight files of a model folder, checked without loading them: each readable (a safetensors
header that its file covers, a `.bin` that is tensors and plain data only) and, with the folder's
config.json, every tensor the architecture has, with its shape.

Why before loading: a truncated file, another model's weights or a pickle holding code otherwise
fail deep inside transformers, an engine actor or a scoring process, as a traceback that names
no file. Here the refusal is one line naming the file and what is wrong (`WeightFileError`; the
caller prefixes the key or checkpoint it came from). Reads headers and tensor metadata only
(a meta-device model for the expected shapes), so a large model costs well under a second.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path


class WeightFileError(ValueError):
    """A model folder's weights cannot be used; the message names the file and what is wrong."""


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files: the shards an index names (each must exist), else model.safetensors,
    else pytorch_model.bin."""
    folder = Path(folder)
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise WeightFileError(f"{index} is not a readable shard index ({type(exc).__name__}: {exc})") from None
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise WeightFileError(f"{index} names {len(shards)} shard(s), {missing[0]} is missing")
            return [folder / s for s in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    return []


def tensor_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in the folder's weight files, read from headers only."""
    shapes: dict[str, tuple[int, ...]] = {}
    files = weight_files(folder)
    if not files:
        raise WeightFileError(f"{folder} holds no weights (model.safetensors, pytorch_model.bin or a shard index)")
    for f in files:
        shapes.update(safetensors_shapes(f) if f.suffix == ".safetensors" else _pickle_shapes(f))
    return shapes


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return {name: tuple(fh.get_slice(name).get_shape()) for name in fh.keys()}
    except (SafetensorError, OSError) as exc:
        raise WeightFileError(f"{path} is not a readable safetensors file ({exc}: truncated or not "
                              f"safetensors)") from None


def _pickle_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """A `.bin` read as checkpoints are (`weights_only`: tensors and plain data; nothing in it runs)."""
    import torch

    try:
        state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        refused = str(exc).split("GLOBAL ", 1)[-1].split()[0] if "GLOBAL " in str(exc) else "an object"
        raise WeightFileError(f"{path} holds more than tensors and plain data ({refused}): refusing to load it "
                              f"(a pickle can run code; convert the folder to safetensors)") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise WeightFileError(f"{path} is not a readable PyTorch file ({str(exc).splitlines()[0]})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightFileError(f"{path} is not a state dict (name -> tensor)")
    return {name: tuple(t.shape) for name, t in state.items()}


def check_weights(folder: Path, auto_class: str = "AutoModelForCausalLM", trust_remote_code: bool = False) -> None:
    """The folder's weights are readable and fit its config.json: every parameter of the
    architecture (`auto_class`) is there with its shape, and nothing else is (a tied output layer
    may be stored or not)."""
    import torch
    import transformers

    folder = Path(folder)
    shapes = tensor_shapes(folder)
    config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = getattr(transformers, auto_class).from_config(config, trust_remote_code=trust_remote_code)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}  # a tied weight once
    known = set(model.state_dict())  # its aliases too
    files = ", ".join(f.name for f in weight_files(folder))
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - known)
    wrong = [(n, shapes[n], expected[n]) for n in sorted(expected) if n in shapes and shapes[n] != expected[n]]
    if wrong:
        name, found, want = wrong[0]
        raise WeightFileError(f"{folder}/{files} does not fit its config.json: {name} has shape {list(found)}, the "
                              f"architecture {list(want)} ({len(wrong)} tensor(s) differ: another model's weights?)")
    if missing or unexpected:
        raise WeightFileError(f"{folder}/{files} does not fit its config.json ({type(model).__name__}): "
                              + (f"missing {missing[:3]}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                                 if missing else "")
                              + ("; " if missing and unexpected else "")
                              + (f"unexpected {unexpected[:3]}" if unexpected else ""))


def check_backend_weights(backend_dir: Path) -> None:
    """The files a checkpoint's backend wrote: every safetensors file readable (a critic's, a LoRA
    adapter's), and the model's weights fitting its config.json (full-weight runs): a CheckpointError
    naming the file."""
    from rlharness.core.checkpoint import CheckpointError
    from rlharness.model.lora import is_lora_checkpoint

    try:
        for f in sorted(backend_dir.rglob("*.safetensors")):
            safetensors_shapes(f)
        if (backend_dir / "config.json").is_file() and not is_lora_checkpoint(backend_dir):
            check_weights(backend_dir)
    except WeightFileError as exc:
        raise CheckpointError(f"checkpoint {backend_dir.parent} is corrupted or of another model: {exc}") from None
