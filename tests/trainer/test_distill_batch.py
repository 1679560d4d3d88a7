"""The teacher's term in the batch (issue 42): -coef x (log pi_student - log pi_teacher) on every trained
token, alone (algo=opd) or added to a group advantage (algo=grpo + algo.teacher.coef), position by
position; tool-output tokens (mask 0) get none; a task without a teacher gets none; an unscored sample of
a task with a teacher is refused."""

from __future__ import annotations

import pytest
import torch

from rlharness.algo.advantages import compute_advantages
from rlharness.config.schema import AlgoConf
from rlharness.core.types import Group, RolloutState, Status
from rlharness.trainer.batch import build_train_batch

GRPO = AlgoConf(name="grpo", advantage="grpo")
OPD = AlgoConf(name="opd", advantage="opd")


def sample(uid: str, score: float, task: str = "t") -> RolloutState:
    s = RolloutState(uid=uid, group_id=uid[0], task=task, prompt_index=0, epoch=0, prompt_text="", prompt_ids=[1, 2],
                     reward={"score": score}, status=Status.COMPLETED, finish_reason="stop")
    s.append_tokens([3, 4], [-0.5, -1.0], [0, 0])
    s.append_tokens([5], [0.0], [0], mask=[0])  # inserted by the loop: no loss, no teacher term
    s.append_tokens([6], [-2.0], [0])
    s.teacher_logprobs = [-1.5, -0.25, -3.0, -1.0]  # scored after the response was complete
    return s


def build(algo, coefs, groups=None):
    groups = groups or [Group.from_samples([sample("a0", 1.0), sample("a1", 0.0)])]
    return build_train_batch(groups, algo, 0, train_step=1, max_response_len=8, temperature=1.0,
                             teacher_coefs=coefs)


def test_opd_advantage_is_minus_the_reverse_kl_per_token():
    batch, metrics = build(OPD, {"t": 1.0})
    p = 2  # response starts after the 2 prompt tokens
    expected = torch.tensor([-(-0.5 + 1.5), -(-1.0 + 0.25), 0.0, -(-2.0 + 1.0)])
    for row in range(2):
        assert torch.allclose(batch.advantages[row, p: p + 4], expected)
        assert batch.advantages[row, :p].abs().sum() == 0
    trained = torch.tensor([1.0, -0.75, -1.0])  # reverse KL of the three trained tokens
    assert metrics["distill/reverse_kl"] == pytest.approx(float(trained.mean()))
    assert metrics["distill/reverse_kl_max"] == pytest.approx(1.0)
    assert metrics["distill/teacher_logprob_mean"] == pytest.approx((-1.5 - 0.25 - 1.0) / 3)
    assert "rollout/adv_abs_mean" not in metrics  # no reward advantage with algo=opd


def test_a_teacher_under_grpo_adds_coef_times_its_term():
    with_teacher, _ = build(GRPO, {"t": 0.5})
    without, metrics = build(GRPO, {})
    assert not any(k.startswith("distill/") for k in metrics)
    group_adv = compute_advantages(torch.tensor([[1.0, 0.0]]), GRPO).reshape(-1)
    assert float(group_adv[0]) > 0 > float(group_adv[1])
    p, mask = 2, torch.tensor([1.0, 1.0, 0.0, 1.0])
    kl = torch.tensor([1.0, -0.75, 0.0, -1.0])
    for row in range(2):
        assert torch.allclose(without.advantages[row, p: p + 4], group_adv[row] * mask)
        assert torch.allclose(with_teacher.advantages[row, p: p + 4], group_adv[row] * mask - 0.5 * kl)


def test_only_the_tasks_with_a_teacher_get_its_term():
    groups = [Group.from_samples([sample("a0", 1.0, "x"), sample("a1", 0.0, "x")]),
              Group.from_samples([sample("b0", 1.0, "y"), sample("b1", 0.0, "y")])]
    batch, _ = build(GRPO, {"x": 2.0}, groups)
    plain, _ = build(GRPO, {}, groups)
    assert not torch.allclose(batch.advantages[:2], plain.advantages[:2])
    assert torch.equal(batch.advantages[2:], plain.advantages[2:])


def test_a_sample_the_teacher_did_not_score_is_refused():
    s = sample("a0", 1.0)
    s.teacher_logprobs = []
    with pytest.raises(ValueError, match="teacher log-probs"):
        build(OPD, {"t": 1.0}, [Group.from_samples([s, sample("a1", 0.0)])])


def test_extending_a_response_drops_the_teacher_scores_of_the_shorter_one():
    """A partial rollout continued later is scored again on the tokens it then has."""
    s = sample("a0", 1.0)
    s.append_tokens([7], [-0.1], [1])
    assert s.teacher_logprobs == []
