"""Reward shaping and sample masks applied before advantages (DAPO's overlong handling).

- `overlong_penalty`: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13). With a
  budget of L = `max_tokens` and a buffer of B = `algo.overlong_buffer_len` tokens, a
  response of n tokens gets 0 when n <= L - B, (L - B - n) / B in the buffer, and -1 at
  L, times `algo.overlong_penalty_factor`; it is added to the judge's score.
- `truncated_samples`: responses cut by the token budget (`finish_reason == "length"`).
  With `algo.mask_truncated` their tokens get no loss (DAPO's overlong filtering): a
  truncated answer is not evidence of a wrong one. They still count in their group's
  baseline.
"""

from __future__ import annotations

import torch

from rlharness.core.types import RolloutState


def overlong_penalty(response_lens: torch.Tensor, max_tokens: int | torch.Tensor, buffer_len: int,
                     factor: float = 1.0) -> torch.Tensor:
    """Per-sample penalty (<= 0) for response lengths `response_lens` (any shape).

    `max_tokens`: the budget, one for all, or a tensor broadcast against `response_lens`
    (e.g. [groups, 1]: each group's task budget in a multi-task run)."""
    if buffer_len <= 0:
        return torch.zeros_like(response_lens, dtype=torch.float32)
    smallest = int(torch.as_tensor(max_tokens).min())
    if buffer_len >= smallest:
        raise ValueError(f"algo.overlong_buffer_len={buffer_len} must be < the token budget max_tokens={smallest}")
    excess = (response_lens.float() - (max_tokens - buffer_len)).clamp(min=0)
    return -factor * torch.clamp(excess / buffer_len, max=1.0)


def truncated_samples(samples: list[RolloutState]) -> list[bool]:
    return [s.finish_reason == "length" for s in samples]
