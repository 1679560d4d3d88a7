"""A warning when an on-policy step's engine log-probs are not the trainer's.

When every trained token was sampled by exactly the weights being trained (version
step - 1: sync, or max_staleness=0 with no partial rollout), the engine's log-probs and
the trainer's recomputation differ by rounding only (float32 tiny model, 400 steps: mean
|diff| per token median 4.5e-7, max 6.2e-7). A step above `algo.onpolicy_logprob_gap_warn`
means the engine computed part of the batch on other weights or another state (what
docs/notes/resume_race.md describes: 1e-4 to 3e-3 per token): "on-policy" was not true for it.
The check is a pure function of the step's batch and the backend's per-row gaps. Where the
trainer and the engine live in this process (backend=torch, engine=hf), the warning also says
whether the engine's weights were the trained ones: exact checksums per block of 1024 elements of
each tensor, taken from the trainer just before the step and from the engine when the warning fires,
tell "other weights" (which tensors, which blocks) from "the same weights, another computation".
A warned step's batch (tokens, the engine's log-probs) and both sides' checksums are kept in the run
directory (`diagnostics/onpolicy_step_XXXXXXXX.pt`): rescored offline with the checkpoint before the
step, they say which tokens went wrong and by how much.

Float32 runs only (trainer and engine both: a float32 trainer feeding a bfloat16 engine,
`model.engine_dtype`, is not one): in bfloat16/float16 the engine's and the trainer's kernels
round apart by 1e-2 to 4e-2 per token on ordinary steps (SmolLM2: vLLM, or the hf engine left-padding a
prompt by an odd count; docs/benchmarks.md "Real-model paths"), which hides a
perturbation of the defect's size, so a threshold there would only raise false alarms.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rlharness.core.checkpoint import save_state
from rlharness.core.types import Group, TrainBatch
from rlharness.weights.transfer import CHECKSUM_BLOCK

# Groups named in the warning, worst first (the rest are counted).
MAX_NAMED = 8


def weights_verdict(trained: dict[str, torch.Tensor] | None, engine: dict[str, torch.Tensor] | None) -> str:
    """What the engine computed with, from the block checksums (`rlharness.weights.transfer.weight_checksums`) of
    the weights being trained and of the engine's ('' when either side cannot say: a remote or another
    engine, LoRA, names or shapes that do not match). A differing tensor is named with the blocks of
    `CHECKSUM_BLOCK` elements that differ: a stale page reads apart from a stale tensor."""
    if not trained or not engine or set(trained) != set(engine) or any(
            trained[k].shape != engine[k].shape for k in trained):
        return ""
    differ = {k: (trained[k] != engine[k]).nonzero().flatten().tolist() for k in sorted(trained)}
    differ = {k: blocks for k, blocks in differ.items() if blocks}
    if not differ:
        return "; the engine's weights are the trained ones bit for bit (another computation, not other weights)"
    named = [f"{k} ({_blocks(blocks, len(trained[k]))})" for k, blocks in list(differ.items())[:MAX_NAMED]]
    more = f" and {len(differ) - MAX_NAMED} more" if len(differ) > MAX_NAMED else ""
    return (f"; the engine's weights differ from the trained ones in {len(differ)} of {len(trained)} tensors "
            f"(blocks of {CHECKSUM_BLOCK} elements): {', '.join(named)}{more}")


def _blocks(blocks: list[int], total: int) -> str:
    if len(blocks) == total:
        return "all of it" if total == 1 else f"all {total} blocks"
    shown = ", ".join(map(str, blocks[:MAX_NAMED])) + (", ..." if len(blocks) > MAX_NAMED else "")
    return f"block{'s' if len(blocks) > 1 else ''} {shown} of {total}"


def save_evidence(path: Path, batch: TrainBatch, row_gaps: list[float] | None,
                  trained: dict[str, torch.Tensor] | None, engine: dict[str, torch.Tensor] | None) -> str:
    """Keep what a warned step can be studied with offline: its tokens and the engine's log-probs (rescore
    them with the checkpoint before the step, whose weights the engine should have held), the per-row gaps
    and both sides' block checksums. Returns the warning's last words (where it is, or why not)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_state({
            "train_step": batch.train_step, "temperature": batch.temperature,
            **{k: getattr(batch, k) for k in ("input_ids", "attention_mask", "response_mask", "rollout_logprobs",
                                              "model_steps")},
            "row_gaps": row_gaps, "trained_checksums": trained, "engine_checksums": engine,
        }, tmp)
        os.replace(tmp, path)
    except OSError as exc:  # a full disk must not stop the run over a diagnostic
        return f"; its batch could not be kept ({exc})"
    return f"; its batch and the checksums are in {path}"


def guard_on(threshold: float, dtype: str) -> bool:
    """The guard checks float32 runs with a positive threshold (`algo.onpolicy_logprob_gap_warn`)."""
    return threshold > 0 and dtype == "float32"


def all_tokens_on_policy(model_steps: torch.Tensor, response_mask: torch.Tensor, step: int) -> bool:
    """Every trained token of step `step` was sampled by version step - 1 (the weights being trained)."""
    trained = response_mask > 0
    return bool(trained.any()) and bool((model_steps[trained] == step - 1).all())


def onpolicy_gap_warning(step: int, groups: list[Group], row_gaps: list[float] | None, step_gap: float,
                         threshold: float, dtype: str = "float32") -> str | None:
    """The warning's text when the step's mean gap `step_gap` exceeds `threshold`, else None.

    `row_gaps`: mean |engine - trainer| log-prob per batch row, rows in the order of `groups`'
    members (None: the backend does not report them). Groups whose mean gap exceeds the threshold
    are named by task, prompt and id. `dtype`: the less precise of the trainer's and the engine's dtypes
    (`ModelConf.narrowest_dtype`; the guard checks float32 only).
    """
    if not guard_on(threshold, dtype) or step_gap <= threshold:
        return None
    head = (f"step {step}: every sample is on-policy but the engine's log-probs differ from the trainer's by "
            f"{step_gap:.2e} per token (train/logprob_diff_rollout; algo.onpolicy_logprob_gap_warn={threshold:g})")
    if row_gaps is None:
        return f"{head}; this backend does not report which groups"
    named, start = [], 0
    for g in groups:
        gaps = row_gaps[start:start + len(g)]
        start += len(g)
        gap = sum(gaps) / len(gaps) if gaps else 0.0
        if gap > threshold:
            named.append((gap, f"{g.task}/prompt {g.prompt_index} (epoch {g.epoch}, group {g.group_id}, "
                               f"rows {start - len(g)}-{start - 1}): {gap:.2e}"))
    named.sort(key=lambda x: -x[0])
    more = f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
    listed = "; ".join(text for _, text in named[:MAX_NAMED]) or "none above it alone (spread over the batch)"
    return f"{head}: the engine computed {len(named)} of {len(groups)} groups on other weights or state: {listed}{more}"
