"""`trainer.probe_longest`: one training micro-batch at the longest shape the config allows, kept nowhere.

The backend's own forward/backward (`_micro_step`: chunked log-probs, the policy loss, the reference
model's pass with a KL term) runs on a synthetic micro-batch of `rows` x (prompt + response) tokens,
then an AdamW step at learning rate 0 and weight decay 0 allocates the optimizer's state without
moving a weight (the update is exactly 0 x a finite number). Then the gradients and the optimizer's
state are dropped (the run's first step creates them afresh, as it would have) and the RNG is put
back: the run trains exactly as without the probe (tests/health/test_probe.py checks it). An
out-of-memory error is returned, not raised, so that it crosses a Ray actor as data.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or any(w in str(exc).lower() for w in OOM_WORDS)


def synthetic_micro_batch(rows: int, prompt_tokens: int, response_tokens: int, vocab: int,
                          device: torch.device) -> dict[str, torch.Tensor]:
    """Rows of random token ids (a fixed generator: the run's RNG is not drawn from), every response
    token trained with advantage 1."""
    length = prompt_tokens + response_tokens
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    response = torch.zeros(rows, length)
    response[:, prompt_tokens:] = 1.0
    return {"input_ids": ids.to(device), "attention_mask": torch.ones(rows, length, dtype=torch.long, device=device),
            "response_mask": response.to(device), "advantages": response.to(device),
            "rollout_logprobs": torch.zeros(rows, length, device=device),
            "model_steps": torch.zeros(rows, length, dtype=torch.long, device=device),
            "rows": torch.arange(rows)}


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak: allocated on a CUDA device, resident (ru_maxrss) on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def probe_micro_batch(backend, rows: int, prompt_tokens: int, response_tokens: int, sums) -> dict[str, Any]:
    """Train `backend` (a Learner over a TorchRunner; `sums`: a fresh metric accumulator of its own) once on the synthetic
    micro-batch and undo it (module docstring). Returns `perf/probe_s` and `probe/peak_mb`, or
    {"oom": <the error's first line>}."""
    device = backend.device
    vocab = backend.model.get_input_embeddings().weight.shape[0]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    groups = backend.optimizer.param_groups
    settings = [(g["lr"], g["weight_decay"]) for g in groups]
    started = time.perf_counter()
    try:
        mb = synthetic_micro_batch(rows, prompt_tokens, response_tokens, vocab, device)
        backend._row_gap = torch.zeros(rows, dtype=torch.float64)
        backend._updates_done = 0
        backend._micro_step(mb, 1.0, float(mb["response_mask"].sum()), response_tokens, sums, first_epoch=True)
        for g in groups:
            g["lr"], g["weight_decay"] = 0.0, 0.0
        backend.optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - only an out-of-memory is the probe's finding
        if not is_out_of_memory(exc):
            raise
        return {"oom": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}
    finally:
        for g, (lr, wd) in zip(groups, settings):
            g["lr"], g["weight_decay"] = lr, wd
        backend.optimizer.zero_grad(set_to_none=True)
        backend.optimizer.state.clear()
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {"perf/probe_s": time.perf_counter() - started, "probe/peak_mb": peak_memory_mb(device)}
