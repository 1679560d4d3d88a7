"""On-policy distillation's per-token reverse KL (rlharness/algo/distill.py) against TRL's GKD loss and the
OPD advantage of verl / tinker-cookbook, on random cases, to 1e-6; and its place in the batch.

TRL is not installed here, so its loss is transcribed: `GKDTrainer.generalized_jsd_loss` (trl/trainer/
gkd_trainer.py) with beta=1 is F.kl_div(teacher_log_probs, student_log_probs, log_target=True), i.e.
KL(student || teacher) summed over the vocabulary per token, averaged over the tokens whose label is
not -100 ("batchmean" with labels). verl's OPD / tinker-cookbook's `incorporate_kl_penalty` use the
one-sample estimate on the sampled token, advantage = -coef x (log p_student(y) - log p_teacher(y)).

The sampled estimate's expectation must equal TRL's full-vocabulary loss, and the gradient of the
policy loss rlharness trains with that advantage (ppo_loss at ratio 1, on-policy) must, in expectation
over the sampled token, equal the gradient of TRL's loss. The expectation is taken exactly, by
enumerating every token of the vocabulary weighted by the student's probability.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlharness.algo.distill import distill_advantages, distill_metrics, reverse_kl
from rlharness.algo.losses import ppo_loss


def trl_gkd_loss(student_logits, teacher_logits, labels, beta=1.0, temperature=1.0):
    """TRL's generalized_jsd_loss (reduction="batchmean"), transcribed; beta in {0, 1} branches only."""
    student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    else:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    mask = labels != -100
    return jsd[mask].sum() / mask.sum()


def verl_opd_advantages(student_logprobs, teacher_logprobs, response_mask, coef):
    """The OPD advantage of verl / tinker-cookbook, transcribed: -coef x (student - teacher) on the sampled token."""
    return -coef * (student_logprobs - teacher_logprobs) * response_mask


def _case(seed: int, rows=3, tokens=5, vocab=11):
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(rows, tokens, vocab, generator=g, dtype=torch.float64) * 2).requires_grad_()
    teacher = torch.randn(rows, tokens, vocab, generator=g, dtype=torch.float64) * 2
    mask = (torch.rand(rows, tokens, generator=g) > 0.3).double()
    mask[0, 0] = 1.0
    return student, teacher, mask


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_expected_reverse_kl_and_its_policy_gradient_equal_trl_gkd_beta_1(seed, temperature):
    student, teacher, mask = _case(seed)
    labels = torch.where(mask > 0, 0, -100)
    trl = trl_gkd_loss(student, teacher, labels, beta=1.0, temperature=temperature)
    (trl_grad,) = torch.autograd.grad(trl, student)

    s_logp = F.log_softmax(student / temperature, dim=-1)  # [B, T, V]
    t_logp = F.log_softmax(teacher / temperature, dim=-1)
    probs = s_logp.exp().detach()
    vocab = student.shape[-1]
    # Every possible sampled token y at every position, weighted by the student's probability of it.
    total_loss = torch.zeros((), dtype=torch.float64)
    expected_kl = torch.zeros_like(mask)
    for y in range(vocab):
        logp_y = s_logp[..., y]
        sampled = logp_y.detach()  # the engine's rollout log-prob of y
        adv = distill_advantages(sampled, t_logp[..., y], mask, coef=1.0).double()
        assert torch.allclose(adv, verl_opd_advantages(sampled, t_logp[..., y], mask, 1.0), atol=1e-12)
        loss, _ = ppo_loss(logp_y, sampled, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
        total_loss = total_loss + (probs[..., y] * loss * mask).sum() / mask.sum()
        expected_kl = expected_kl + probs[..., y] * reverse_kl(sampled, t_logp[..., y]).double()
    (ours_grad,) = torch.autograd.grad(total_loss, student)

    assert float(((expected_kl * mask).sum() / mask.sum() - trl.detach()).abs()) < 1e-6
    assert torch.allclose(ours_grad, trl_grad, atol=1e-6, rtol=0)


def test_beta_0_is_the_forward_kl_not_the_reverse():
    """The transcription's branch that must differ: the forward KL (beta=0) is not what OPD estimates."""
    student, teacher, mask = _case(0)
    labels = torch.where(mask > 0, 0, -100)
    forward, reverse = trl_gkd_loss(student, teacher, labels, 0.0), trl_gkd_loss(student, teacher, labels, 1.0)
    assert float((forward - reverse).abs()) > 1e-3


def test_coef_scales_per_row_and_mask_zeroes():
    s = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -0.3]])
    t = torch.tensor([[-1.5, -1.0, -0.5], [-1.1, -0.2, -2.3]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = distill_advantages(s, t, mask, torch.tensor([0.5, 2.0]))
    assert torch.allclose(adv, torch.tensor([[-0.25, 0.5, 0.0], [-2.0, 0.0, -4.0]]))
    m = distill_metrics(s, t, mask)
    kl = torch.tensor([0.5, -1.0, 1.0, 0.0, 2.0])
    assert m["distill/reverse_kl"] == pytest.approx(float(kl.mean()))
    assert m["distill/reverse_kl_max"] == pytest.approx(2.0)
    assert m["distill/teacher_logprob_mean"] == pytest.approx(float(torch.tensor([-1.5, -1.0, -1.1, -0.2, -2.3]).mean()))
    assert distill_metrics(s, t, torch.zeros_like(mask)) == {}
