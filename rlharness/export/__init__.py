"""Export a run's checkpoint as an ordinary Hugging Face model folder.

    python -m rlharness.export <run dir> [--step N] <out dir>
    python -m rlharness.export <run dir>/checkpoints/step_XXXXXXXX <out dir>

The folder holds config.json, model.safetensors, the tokenizer (with its chat template) and
generation_config.json, nothing of the training state (optimizer, scheduler, RNG, producer,
DeepSpeed's shards): `AutoModelForCausalLM.from_pretrained(<out dir>)` and `vllm serve <out
dir>` load it. Every training backend keeps the model's HF files in `checkpoints/step_N/backend/`
(torch and FSDP2: next to its `backend_state.pt`; DeepSpeed: next to its `deepspeed/` ZeRO shards;
the sharded ones gather the full weights on rank 0 at save), so one reader serves them all.

`checkpoint_state_dict` is the one place that turns a checkpoint into the full model's weights:
a LoRA run merges its adapter into the base weights there, and the export, `evaluate.py
resume=<run>` and anything else built on it get the merged model.

Refused in one line (exit 2, nothing written): a run directory without complete checkpoints,
a `--step` that has none (the line lists the steps there are), a checkpoint whose files are
truncated, unreadable or of another model (rlharness/model/weight_files.py), an output path that is a
file, a dangling symbolic link, a folder that is not empty or one inside the run's checkpoints/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from rlharness.core.checkpoint import CheckpointError, complete_checkpoints, error_line
from rlharness.core.redaction import redact
from rlharness.core.run_dir import RunDir, checkpoint_folder_of, not_a_run_hint, output_path_problem
from rlharness.model.weight_files import check_backend_weights

log = logging.getLogger(__name__)

BACKEND_SUBDIR = "backend"  # where both backends write the model's HF files inside a checkpoint


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> tuple[int, Path]:
    """(step, path) of the run's checkpoint `step`, or its newest complete one; `run_dir` may name the
    checkpoint folder itself (`<run>/checkpoints/step_N`)."""
    run = Path(run_dir)
    folder = checkpoint_folder_of(run)
    if folder is not None and run.is_dir():
        if step is not None and step != folder[1]:
            raise CheckpointError(f"{run_dir} is the checkpoint of step {folder[1]}, not of --step {step}")
        run, step = folder
    if not run.is_dir():
        raise CheckpointError(f"{run_dir}: no such directory")
    found = complete_checkpoints(run)
    if not found:
        hint = not_a_run_hint(run)
        raise CheckpointError(f"{run_dir}: {hint}" if hint else
                              f"{run_dir} holds no complete checkpoint (checkpoints/step_*/DONE)")
    if step is None:
        return found[-1]
    for s, path in found:
        if s == step:
            return s, path
    raise CheckpointError(f"{run_dir} has no complete checkpoint at step {step}; the steps there are: "
                          f"{', '.join(str(s) for s, _ in found)}")


def model_dir(ckpt_dir: Path) -> Path:
    """The HF files of a checkpoint (config, weights, tokenizer); a LoRA run's: its base model's."""
    d = Path(ckpt_dir) / BACKEND_SUBDIR
    base = lora_base(ckpt_dir)
    if base is not None:
        return base
    if not (d / "config.json").is_file():
        raise CheckpointError(f"checkpoint {ckpt_dir} has no model files ({BACKEND_SUBDIR}/config.json): "
                              f"written by backend=sim?")
    return d


def lora_base(ckpt_dir: Path) -> Path | None:
    """The base model folder of a LoRA run's checkpoint (its `backend/` holds only the adapter), else None."""
    import yaml

    from rlharness.model.lora import is_lora_checkpoint
    from rlharness.model.load import resolve_model_path

    if not is_lora_checkpoint(Path(ckpt_dir) / BACKEND_SUBDIR):
        return None
    run_config = RunDir(Path(ckpt_dir).parent.parent).config  # model.path is fixed for a run
    if not run_config.is_file():
        raise CheckpointError(f"checkpoint {ckpt_dir} holds a LoRA adapter, and its run has no "
                              f".hydra/config.yaml naming the base model")
    return resolve_model_path(yaml.safe_load(run_config.read_text())["model"]["path"])


def checkpoint_state_dict(ckpt_dir: Path) -> dict:
    """The full model's weights (name -> tensor) of a checkpoint; a LoRA run's adapter is merged
    into its base model's weights here, so every reader gets the merged model."""
    from safetensors.torch import load_file

    base = lora_base(ckpt_dir)
    if base is not None:
        from rlharness.model.lora import merged_state_dict_from_checkpoint

        return merged_state_dict_from_checkpoint(Path(ckpt_dir) / BACKEND_SUBDIR, base)
    d = model_dir(ckpt_dir)
    index = d / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    state: dict = {}
    for shard in shards:
        if not (d / shard).is_file():
            raise CheckpointError(f"checkpoint {ckpt_dir}: {BACKEND_SUBDIR}/{shard} is missing")
        state.update(load_file(str(d / shard)))  # safetensors: data only, never code
    return state


def export_checkpoint(ckpt_dir: Path, out_dir: str | Path) -> Path:
    """Write the checkpoint's model as an HF folder at `out_dir` (which must be absent or empty)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    refuse_output(out, ckpt_dir.parent.parent)
    src = model_dir(ckpt_dir)
    check_backend_weights(Path(ckpt_dir) / BACKEND_SUBDIR)  # readable, and the weights fit config.json
    t0 = time.monotonic()
    try:
        state = checkpoint_state_dict(ckpt_dir)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a LoRA adapter or base model that does not load: named
        raise CheckpointError(f"checkpoint {ckpt_dir} cannot be read: {error_line(exc)}") from exc
    config = AutoConfig.from_pretrained(str(src))
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()  # a tied output layer is saved once, as the embedding
    # Every weight of the architecture must come from the checkpoint (tied ones through their twin).
    loaded = {t.data_ptr() for t in state.values()}
    current = model.state_dict()
    missing = [n for n in missing if current[n].data_ptr() not in loaded]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {ckpt_dir} does not fit its config.json: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    tmp = out.parent / f".tmp-export-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if (src / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(src))
        model.save_pretrained(tmp)  # config.json, model.safetensors, generation_config.json
        AutoTokenizer.from_pretrained(str(src)).save_pretrained(tmp)  # tokenizer files and chat template
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s to %s in %.1fs", ckpt_dir, out, time.monotonic() - t0)
    return out


def refuse_output(out: Path, run_dir: Path) -> None:
    """The output folder must be absent or an empty folder, and not inside the run's checkpoints/ (where a
    running or resumed run prunes and cleans up folders)."""
    problem = output_path_problem(out)
    if problem is not None:
        raise CheckpointError(f"output folder {out}: {problem}; choose another folder")
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"output folder {out} is not empty: refusing to overwrite it (choose a new folder)")
    checkpoints = RunDir(run_dir).checkpoints.resolve()
    if out.resolve() == checkpoints or checkpoints in out.resolve().parents:
        raise CheckpointError(f"output folder {out} is inside the run's {checkpoints}: the run's checkpoints are "
                              f"pruned and cleaned there; export somewhere else (e.g. exported/{run_dir.name})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlharness.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory (outputs/<date>/<time>) or one of its checkpoint folders")
    ap.add_argument("out_dir", help="the HF folder to write (absent or empty)")
    ap.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        refuse_output(Path(args.out_dir), Path(args.run_dir))
        step, ckpt = find_checkpoint(args.run_dir, args.step)
        print(f"exporting {ckpt} (step {step}) to {args.out_dir} ...", file=sys.stderr, flush=True)
        export_checkpoint(ckpt, args.out_dir)
    except CheckpointError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2
    print(f"done: {args.out_dir} is a Hugging Face model folder (AutoModelForCausalLM.from_pretrained, "
          f"vllm serve {args.out_dir})", file=sys.stderr)
    return 0

