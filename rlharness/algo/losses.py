"""Per-token policy-gradient pieces: log-probs, the clipped loss, KL, entropy, TIS, aggregation.

Alignment (see `rlharness.types.TrainBatch`): every [B, T] tensor here is indexed by
the token's own position. The distribution that produced token t is the one in the
logits at t - 1, so `token_logprobs` and `token_entropy` shift once and put position
0 (which no distribution produced) at 0. Masks, advantages and rollout log-probs
then line up with no further shifting anywhere.

The loss differs from the textbook PPO surrogate in two documented ways:
- asymmetric clipping, ratio in [1 - clip_eps_low, 1 + clip_eps_high] (DAPO's
  clip-higher keeps exploring tokens from being clipped away);
- truncated importance sampling (TIS) for stale or mismatched samples: the per-token
  loss is multiplied by min(exp(old - rollout), tis_cap), detached, where `old` is the
  trainer's log-prob before the update and `rollout` what the engine reported.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _shift_to_token_positions(per_prediction: torch.Tensor) -> torch.Tensor:
    """[B, T] values computed at the predicting position t - 1 -> indexed by token t (0 at t=0)."""
    out = torch.zeros_like(per_prediction)
    out[:, 1:] = per_prediction[:, :-1]
    return out


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) at [:, t]; [:, 0] is 0.

    Uses gather - logsumexp instead of a full log_softmax so only [B, T] extra memory
    is needed besides the (temperature-scaled) logits.
    """
    if logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and input_ids {tuple(input_ids.shape)} disagree on [B, T]")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 to score tokens")
    pred = logits[:, :-1].float()
    if temperature != 1.0:
        pred = pred / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    lp = pred.gather(-1, targets).squeeze(-1) - torch.logsumexp(pred, dim=-1)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype, device=lp.device)
    out[:, 1:] = lp
    return out


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the distribution that produced token t, at [:, t]; [:, 0] is 0."""
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return _shift_to_token_positions(ent)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def loss_denominator(mask: torch.Tensor, mode: str) -> float:
    """What `aggregate_loss` divides by, over the whole (mini-)batch: tokens or sequences.

    Computed once per optimizer step so every micro-batch divides by the same number
    and gradient accumulation gives the full-batch result whatever the micro-batch size.
    """
    if mode == "token_mean":
        return float(mask.sum().clamp(min=1).item())
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum_norm"):
        return float(max(int((mask.sum(-1) > 0).sum().item()), 1))
    raise ValueError(f"algo.loss_agg={mode!r} is not allowed: expected one of {LOSS_AGG_MODES}")


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, max_response_len: int = 0,
                   denominator: float | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token_mean: sum over all response tokens / number of tokens (DAPO).
    seq_mean_token_mean: per-sequence token mean, then mean over sequences (GRPO paper).
    seq_mean_token_sum_norm: per-sequence token sum / max_response_len, mean over
      sequences (Dr.GRPO: a constant normaliser removes the length bias).
    `denominator` (from `loss_denominator` on the full batch) replaces the local count
    when the batch is processed in micro-batches; sequences without response tokens
    never count.
    """
    mask = mask.to(per_token.dtype)
    if mode == "token_mean":
        num = (per_token * mask).sum()
    elif mode == "seq_mean_token_mean":
        num = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    elif mode == "seq_mean_token_sum_norm":
        if max_response_len <= 0:
            raise ValueError("loss_agg=seq_mean_token_sum_norm needs max_response_len > 0")
        num = (per_token * mask).sum(-1).sum() / max_response_len
    else:
        raise ValueError(f"algo.loss_agg={mode!r} is not allowed: expected one of {LOSS_AGG_MODES}")
    den = loss_denominator(mask, mode) if denominator is None else denominator
    return num / den


def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        clip_eps_low: float, clip_eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate -min(r A, clip(r, 1-low, 1+high) A) and where the clip is active.

    Returns (loss [B, T], clipped [B, T] bool): `clipped` marks tokens whose gradient the
    clip removed (the clipped term was the larger loss), for the clip-fraction metric.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped_term = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    return torch.maximum(unclipped, clipped_term), clipped_term > unclipped


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens (Schulman's k1 / k3).

    k1 = log p - log q (unbiased, can be negative); k3 = q/p - log(q/p) - 1 (unbiased, >= 0).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"algo.kl_estimator={estimator!r} is not allowed: expected k1 or k3")


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance weights min(exp(old - rollout), cap), detached; 1 outside `mask`.

    Also returns sums over masked tokens for the metrics (so micro-batches add up):
    ratio_sum (untruncated ratio), truncated_sum (ratio > cap), abs_diff_sum
    (|old - rollout|, the trainer/engine mismatch), and tokens. cap = 0 disables the
    weighting (weights are 1) but the mismatch metrics are still measured.
    """
    m = mask > 0
    log_ratio = torch.where(m, (old_logprobs - rollout_logprobs).detach(), torch.zeros_like(old_logprobs))
    ratio = torch.exp(log_ratio)
    if cap > 0:
        weights = torch.where(m, torch.clamp(ratio, max=cap), torch.ones_like(ratio))
        truncated = (ratio > cap) & m
    else:
        weights = torch.ones_like(ratio)
        truncated = torch.zeros_like(m)
    stats = {
        "ratio_sum": (ratio * m).sum(),
        "truncated_sum": truncated.sum().to(ratio.dtype),
        "abs_diff_sum": log_ratio.abs().sum(),
        "tokens": m.sum().to(ratio.dtype),
    }
    return weights.detach(), stats
