"""Per-token policy-gradient pieces: log-probs, policy losses, KL, entropy, off-policy corrections.

Alignment (see `rlharness.core.types.TrainBatch`): every [B, T] tensor here is indexed by
the token's own position. The distribution that produced token t is the one in the
logits at t - 1, so `token_logprobs` and `token_entropy` shift once and put position
0 (which no distribution produced) at 0. Masks, advantages and rollout log-probs
then line up with no further shifting anywhere.

Three log-probs meet in the loss: `logprobs` (the policy being trained), `old` (the
trainer's log-prob before this update: the PPO ratio's denominator) and `rollout`
(what the engine reported when it sampled the token). Two separate, pure pieces use them:

- a policy loss, picked by name (`algo.policy_loss`, table `POLICY_LOSSES` in rlharness/config/schema.py), of
  (logprobs, old, advantages, mask) -> per-token loss and where its clip was active:
    ppo:       -min(r A, clip(r, 1 - low, 1 + high) A), r = exp(logprobs - old)
               (asymmetric clip: DAPO's clip-higher);
    dual_clip: ppo, and for A < 0 the loss is capped at -c A (`algo.clip_ratio_c`, c > 1,
               verl's default 3; Ye et al. 2019): a huge ratio on a bad token cannot
               blow the step up;
    gspo:      ppo on the sequence ratio s = exp(mean_t(logprobs - old)) (Zheng et al.
               2025), written per token as sg[s] * exp(logprobs - sg[logprobs]) so that a
               per-sequence token mean (`loss_agg=seq_mean_token_mean`, required) gives
               the GSPO objective and its gradient exactly;
    cispo:     -sg[clip(r, 1 - low, 1 + high)] A logprobs (MiniMax-M1 2025): the clipped
               ratio is a detached weight, so no token loses its gradient (the reported
               pg_loss is then a different quantity from ppo's);
- off-policy corrections between `old` and `rollout` (stale samples, engine/trainer
  numerics), applied as a detached per-token weight on the policy loss:
    truncated IS (`algo.tis_cap`, `algo.tis_level`): min(rho, cap) with rho the token
      ratio exp(old - rollout) or the sequence ratio exp(sum_t(old - rollout));
    rejection (`algo.rejection`, `algo.rejection_low/high`): weight 0 for tokens (or
      whole sequences) whose rho leaves [low, high]; they still count in the loss
      normaliser (as TRL's masks), so a step with many rejections is a smaller step.
  A decoupled objective (e.g. a proximal policy between old and rollout) composes the
  same way: the loss takes the proximal log-probs as `old`, the correction the rest.

Robustness: every log-ratio is clamped to +-LOG_RATIO_CLAMP before `exp` (verl does the
same; exp(100) is inf in float32 and would skip the step), and masking uses `where`,
never multiplication (inf * 0 is NaN).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlharness.config.registry import resolve
from rlharness.config.schema import POLICY_LOSSES

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
CORRECTION_LEVELS = ("token", "sequence")
# exp(20) ~ 4.9e8 is finite in float32 and bf16; exp(89) overflows float32.
LOG_RATIO_CLAMP = 20.0


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask > 0, else 0 (a NaN or inf outside the mask stays out; x * mask would not)."""
    return torch.where(mask > 0, x, torch.zeros_like(x))


def clamped_log_ratio(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.clamp(logprobs - base_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


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
    return masked(x, mask).sum() / mask.sum().clamp(min=1)


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
    kept = masked(per_token, mask)
    if mode == "token_mean":
        num = kept.sum()
    elif mode == "seq_mean_token_mean":
        num = (kept.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    elif mode == "seq_mean_token_sum_norm":
        if max_response_len <= 0:
            raise ValueError("loss_agg=seq_mean_token_sum_norm needs max_response_len > 0")
        num = kept.sum(-1).sum() / max_response_len
    else:
        raise ValueError(f"algo.loss_agg={mode!r} is not allowed: expected one of {LOSS_AGG_MODES}")
    den = loss_denominator(mask, mode) if denominator is None else denominator
    return num / den



# ----------------------------------------------------------------------------- policy losses
# A policy loss: (logprobs, old_logprobs, advantages, mask, **knobs) -> (loss [B, T], clipped [B, T] bool).
# `clipped` marks tokens whose gradient a clip removed or changed, for `train/clip_frac`.
PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def get_policy_loss(name: str) -> PolicyLossFn:
    """The loss `algo.policy_loss=name` names (the table: `POLICY_LOSSES` in rlharness/config/schema.py)."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"algo.policy_loss={name!r} is not allowed: expected one of {sorted(POLICY_LOSSES)}")
    return resolve(POLICY_LOSSES[name])


def compute_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, algo) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss named by `algo.policy_loss` with its knobs from `algo` (an AlgoConf)."""
    return get_policy_loss(algo.policy_loss)(
        logprobs, old_logprobs, advantages, mask,
        clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, clip_ratio_c=algo.clip_ratio_c)


def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        clip_eps_low: float, clip_eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate -min(r A, clip(r, 1-low, 1+high) A) and where the clip is active.

    Returns (loss [B, T], clipped [B, T] bool): `clipped` marks tokens whose gradient the
    clip removed (the clipped term was the larger loss), for the clip-fraction metric.
    """
    ratio = torch.exp(clamped_log_ratio(logprobs, old_logprobs))
    unclipped = -advantages * ratio
    clipped_term = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    return torch.maximum(unclipped, clipped_term), clipped_term > unclipped


def ppo_loss(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float,
             **_: float) -> tuple[torch.Tensor, torch.Tensor]:
    return clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)


def dual_clip_loss(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float,
                   clip_ratio_c: float, **_: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO, and for A < 0: min(ppo loss, -c A). The cap removes the gradient of tokens with r > c."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"algo.clip_ratio_c={clip_ratio_c} is not allowed: expected > 1")
    loss, clipped = clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    cap = -advantages * clip_ratio_c
    negative = advantages < 0
    capped = negative & (loss > cap)
    return torch.where(negative, torch.minimum(loss, cap), loss), clipped | capped


def gspo_loss(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float,
              **_: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped loss on the sequence ratio s_i = exp(mean over the response of (logprobs - old)).

    Per token: s_it = sg[s_i] * exp(logprobs_t - sg[logprobs_t]) has the value s_i and the
    gradient s_i * grad(logprobs_t); the per-sequence token mean of -A s_it then has the
    gradient -A grad(s_i), GSPO's. (GSPO's paper uses a tiny clip range, e.g. 3e-4/4e-4.)
    """
    log_ratio = masked(logprobs - old_logprobs, mask).detach()
    seq_log_ratio = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    log_s = torch.clamp(logprobs - logprobs.detach() + seq_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s = torch.exp(log_s)
    unclipped = -advantages * s
    clipped_term = -advantages * torch.clamp(s, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    return torch.maximum(unclipped, clipped_term), clipped_term > unclipped


def cispo_loss(logprobs, old_logprobs, advantages, mask, *, clip_eps_low: float, clip_eps_high: float,
               **_: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-sg[clip(r, 1-low, 1+high)] * A * logprobs: REINFORCE weighted by a clipped, detached IS ratio."""
    ratio = torch.exp(clamped_log_ratio(logprobs, old_logprobs)).detach()
    weight = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    return -weight * advantages * logprobs, weight != ratio


# ----------------------------------------------------------------------------- KL, corrections
def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str,
               clamp: float = 0.0) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens (Schulman's k1 / k3).

    k1 = log p - log q (unbiased, can be negative); k3 = q/p - log(q/p) - 1 (unbiased, >= 0).
    `clamp` > 0 caps k3 at that value (verl's low_var_kl uses 10): one token far from the
    reference cannot dominate the loss; its log-ratio is clamped to +-20 before `exp` always.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        safe = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        k3 = torch.exp(-safe) + safe - 1.0
        return torch.clamp(k3, max=clamp) if clamp > 0 else k3
    raise ValueError(f"algo.kl_estimator={estimator!r} is not allowed: expected k1 or k3")


def rollout_log_ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                      level: str) -> torch.Tensor:
    """log(pi_old / pi_rollout) per token, or the sequence's sum on each of its tokens; 0 off the mask.

    Detached and clamped to +-LOG_RATIO_CLAMP (a sequence ratio of exp(20) is already absurd).
    """
    per_token = masked(old_logprobs - rollout_logprobs, mask).detach()
    if level == "token":
        log_ratio = per_token
    elif level == "sequence":
        log_ratio = masked(per_token.sum(-1, keepdim=True).expand_as(per_token), mask)
    else:
        raise ValueError(f"correction level {level!r} is not allowed: expected one of {CORRECTION_LEVELS}")
    return torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                cap: float, level: str = "token") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance weights min(rho, cap), detached; 1 outside `mask`.

    rho is the token ratio exp(old - rollout) (`level="token"`, biased, low variance) or
    the sequence ratio exp(sum over the response of (old - rollout)) on every token of
    the sequence (`level="sequence"`, the unbiased sequence-level weight, high variance).
    Also returns sums over masked tokens for the metrics (so micro-batches add up):
    ratio_sum (untruncated rho), truncated_sum (rho > cap), abs_diff_sum (|old - rollout|
    per token: the trainer/engine mismatch), abs_diff_max (its worst token), row_abs_diff
    (its mean per row, [B]) and tokens. cap = 0 disables the weighting
    (weights are 1) but the metrics are still measured.
    """
    m = mask > 0
    ratio = torch.exp(rollout_log_ratio(old_logprobs, rollout_logprobs, mask, level))
    if cap > 0:
        weights = torch.where(m, torch.clamp(ratio, max=cap), torch.ones_like(ratio))
        truncated = (ratio > cap) & m
    else:
        weights = torch.ones_like(ratio)
        truncated = torch.zeros_like(m)
    stats = {
        "ratio_sum": masked(ratio, mask).sum(),
        "truncated_sum": truncated.sum().to(ratio.dtype),
        "tokens": m.sum().to(ratio.dtype),
    }
    abs_diff = masked(old_logprobs - rollout_logprobs, mask).detach().abs()
    stats["abs_diff_sum"] = abs_diff.sum()
    stats["abs_diff_max"] = abs_diff.max() if abs_diff.numel() else abs_diff.new_zeros(())
    stats["row_abs_diff"] = abs_diff.sum(-1) / m.sum(-1).clamp(min=1)
    return weights.detach(), stats


def rejection_mask(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                   low: float, high: float, level: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """1 where rho (token or sequence ratio, as `tis_weights`) lies in [low, high], else 0; 1 off the mask.

    `low` = 0 means no lower bound. Returns the keep mask (detached) and rejected_sum,
    the number of masked tokens rejected (a rejected sequence counts all its tokens).
    """
    m = mask > 0
    ratio = torch.exp(rollout_log_ratio(old_logprobs, rollout_logprobs, mask, level))
    rejected = m & ((ratio < low) | (ratio > high))
    keep = (~rejected).to(old_logprobs.dtype)
    return keep.detach(), {"rejected_sum": rejected.sum().to(old_logprobs.dtype)}
# ----------------------------------------------------------------------------- decoupled objective
PROXIMAL_METHODS = ("recompute", "loglinear", "behaviour")


def proximal_logprobs(method: str, *, current: torch.Tensor, behaviour: torch.Tensor, model_steps: torch.Tensor,
                      train_step: int, updates_done: int, updates_per_step: int,
                      start_of_step: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probs of the proximal policy of the decoupled PPO objective (AReaL, Fu et al. 2025), detached.

    Three policies meet in the loss: the behaviour policy (whatever weight version made each
    token: `behaviour`, the rollout's log-probs), the proximal policy (the weights at the start
    of this training step) and the one being trained (`current`). The clip is taken against the
    proximal policy, so the trust region is the same for fresh and stale tokens, and the
    behaviour/proximal ratio becomes a (truncated) importance weight (`tis_weights` with the
    proximal log-probs as `old`).

    recompute: the start-of-step weights' own log-probs: `start_of_step` (a no-grad forward
      before the first update) or, before any update of this step, `current` itself.
    loglinear: AReaL's approximation without that forward: in update units (a version is
      `updates_per_step` optimizer updates), a token of version v_b, the proximal policy at
      (t-1)U and the current one at (t-1)U + u give alpha = ((t-1)U - v_b U) / ((t-1)U + u - v_b U)
      and log p_prox ~ log p_b + alpha (log p_current - log p_b). Exact at both ends: alpha = 1
      before the first update (current = proximal) and alpha = 0 for on-policy tokens once the
      weights moved (proximal = behaviour); interpolated in between.
    behaviour: the coupled objective: the proximal policy is the behaviour policy (clip against
      the rollout log-probs, importance weight 1), what PPO does without a proximal policy.
    """
    if method == "behaviour":
        return behaviour.detach()
    if method == "recompute":
        if start_of_step is not None:
            return start_of_step.detach()
        if updates_done != 0:
            raise ValueError("proximal=recompute after an update needs the start-of-step log-probs")
        return current.detach()
    if method == "loglinear":
        behind = (train_step - 1 - model_steps).clamp(min=0).to(current.dtype) * updates_per_step
        denominator = behind + updates_done
        alpha = torch.where(denominator > 0, behind / denominator.clamp(min=1e-9), torch.ones_like(behind))
        return (behaviour + alpha * (current - behaviour)).detach()
    raise ValueError(f"algo.proximal={method!r} is not allowed: expected one of {PROXIMAL_METHODS}")
