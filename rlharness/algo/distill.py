"""On-policy distillation: a teacher's per-token log-probs as the learning signal (pure tensor functions).

The student samples; the teacher scores the sampled tokens (rlharness/teacher/). Per response token t

    reverse_kl_t = log pi_student(y_t) - log pi_teacher(y_t)

with log pi_student the engine's log-prob of the token it sampled (the rollout log-prob the sample
carries) and log pi_teacher the teacher's on the same prefix. It is a one-sample estimate of the
per-token reverse KL, KL(pi_student || pi_teacher) = E_{y ~ pi_student}[log pi_student(y) - log
pi_teacher(y)]. Used as the token's advantage, -coef x reverse_kl_t, by the usual policy-gradient
loss (ratio 1 on-policy), its gradient is coef x reverse_kl_t x grad log pi_student(y_t), whose
expectation over y_t is coef x grad KL(pi_student || pi_teacher) (the score function's mean is 0):
exactly the gradient of TRL's GKD loss with beta = 1 (reverse KL over the whole vocabulary), without
the student's full distribution, as Thinking Machines' and verl's OPD do (tests/algo/test_distill.py
checks both to 1e-6).

Unlike GRPO's it is per token and needs no baseline: no discount, no group (algo=opd allows
sampler.prompt_repeat_k=1). Added to another algorithm's advantage (algo.teacher.coef), it is a
dense, per-token term next to the sparse reward's. A stale sample (async) carries the log-probs of
the weights that sampled it: the distillation term is taken against that behaviour policy, and the
off-policy correction of the loss (algo.tis_*) applies to the student's ratio as for any advantage.
"""

from __future__ import annotations

import torch


def reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Per token: log pi_student - log pi_teacher of the sampled token (nats), in the wider of their dtypes."""
    return student_logprobs - teacher_logprobs


def distill_advantages(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                       coef: torch.Tensor | float) -> torch.Tensor:
    """[B, T] per-token advantages -coef x reverse_kl, 0 outside `mask`. `coef` a number or [B] (per row:
    a task's own teacher weight; 0 for rows without a teacher)."""
    kl = reverse_kl(student_logprobs, teacher_logprobs)
    coef = torch.as_tensor(coef, dtype=kl.dtype)
    if coef.dim() == 1:
        coef = coef.unsqueeze(1)
    return -coef * kl * mask


def distill_metrics(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, float]:
    """distill/reverse_kl (mean per token), distill/reverse_kl_max and distill/teacher_logprob_mean over
    the tokens of `mask` (the trained tokens of samples a teacher scored)."""
    on = mask > 0
    if not bool(on.any()):
        return {}
    kl = reverse_kl(student_logprobs, teacher_logprobs)[on]
    return {"distill/reverse_kl": float(kl.mean()), "distill/reverse_kl_max": float(kl.max()),
            "distill/teacher_logprob_mean": float(teacher_logprobs[on].mean())}
