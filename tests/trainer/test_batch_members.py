"""How samples become training rows: members that failed for a reason that is not the policy's
(`algo.failed_member_policy`), and the extra token sequences (branches) of a gateway sample."""

from __future__ import annotations

import pytest
import torch

from rlharness.algo.advantages import compute_advantages
from rlharness.config.schema import ADVANTAGES, AlgoConf, ConfigError
from rlharness.core.member_failures import mark_infra_failure, settle
from rlharness.core.types import Group, RolloutState, Status
from rlharness.trainer.batch import build_train_batch

PAD = 0
ESTIMATORS = sorted(k for k, v in ADVANTAGES.items() if v is not None)


def member(i: int, score: float | None, ids=(5, 6), failed: str | None = None) -> RolloutState:
    s = RolloutState(uid=f"g-{i}", group_id="g", task="t", prompt_index=0, epoch=0, prompt_text="", prompt_ids=[1, 2],
                     reward=None if score is None else {"score": score}, status=Status.COMPLETED, finish_reason="stop")
    s.append_tokens(list(ids), [-0.5] * len(ids), [0] * len(ids))
    if failed:
        mark_infra_failure(s, failed, "Traceback ...")
    return s


def group(failed_at: tuple[int, ...] = (2,)) -> Group:
    scores = [1.0, 0.0, None, 0.0, 1.0]
    return Group.from_samples([member(i, None if i in failed_at else scores[i] if scores[i] is not None else 0.0,
                                      failed="agent crashed" if i in failed_at else None) for i in range(5)])


def build(groups, policy: str, advantage: str = "grpo"):
    return build_train_batch(groups, AlgoConf(name="x", advantage=advantage, failed_member_policy=policy), PAD,
                             train_step=1, max_response_len=8, temperature=1.0)


@pytest.mark.parametrize("advantage", ESTIMATORS)
def test_mask_leaves_a_failed_member_out_of_the_statistics_and_the_loss(advantage):
    """The failed member's row gets no loss and advantage 0; the others get the estimator over the valid
    members alone (for every estimator that uses group statistics); rewards are the valid members'."""
    g = group()
    assert settle(g, "mask") is None  # four valid members: the group is trained
    batch, metrics = build([g], "mask", advantage)
    assert batch.response_mask[2].sum() == 0 and batch.advantages[2].abs().sum() == 0
    valid = [0, 1, 3, 4]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    expected = compute_advantages(rewards, AlgoConf(name="x", advantage=advantage)).reshape(-1)
    for row, want in zip(valid, expected.tolist()):
        assert batch.response_mask[row].sum() == 2
        torch.testing.assert_close(batch.advantages[row, 2:4], torch.tensor([want] * 2), atol=1e-5, rtol=0)
    assert metrics["rollout/members_masked"] == 1 and metrics["rollout/reward_mean"] == 0.5


@pytest.mark.parametrize("advantage", ESTIMATORS)
def test_zero_scores_a_failed_member_0_and_trains_it(advantage):
    g = group()
    assert settle(g, "zero") is None and g.samples[2].reward == {"score": 0.0}
    batch, metrics = build([g], "zero", advantage)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0]])
    expected = compute_advantages(rewards, AlgoConf(name="x", advantage=advantage)).reshape(-1)
    torch.testing.assert_close(batch.advantages[:, 2], expected, atol=1e-5, rtol=0)
    assert batch.response_mask[2].sum() == 2 and metrics["rollout/members_masked"] == 0


def test_settle_says_which_groups_are_dropped_and_why():
    assert "algo.failed_member_policy=drop_group" in settle(group(), "drop_group")
    assert settle(group(), "drop_group").startswith("infrastructure failures: 1 of 5 member(s)")
    one_left = group(failed_at=(0, 1, 2, 3))
    assert "1 valid member(s) left of 5" in settle(one_left, "mask")
    assert settle(group(failed_at=(0, 1, 2, 3)), "zero") is None
    assert "every member" in settle(group(failed_at=(0, 1, 2, 3, 4)), "zero")
    assert settle(group(failed_at=()), "drop_group") is None  # nothing failed: nothing to say
    assert "member g-2: agent crashed" in settle(group(), "drop_group")


def test_the_policy_is_a_checked_knob():
    with pytest.raises(ConfigError, match="algo.failed_member_policy='skip' is not allowed: expected one of mask, "
                                          "zero, drop_group"):
        AlgoConf(name="x", failed_member_policy="skip")


def test_branches_are_rows_of_their_own_after_every_sample_with_the_samples_advantage():
    """A sample with two extra token sequences: rows 0-1 are the samples (member order), rows 2-3 the first
    sample's branches, each with its own prompt, tokens, log-probs and versions, and its sample's advantage."""
    a, b = member(0, 1.0), member(1, 0.0)
    a.extra["branches"] = [
        {"prompt_ids": [1, 2, 5], "response_ids": [7, 8, 9], "response_logprobs": [-0.1, -0.2, -0.3],
         "response_model_steps": [1, 1, 1], "response_mask": [1, 0, 1]},
        {"prompt_ids": [3], "response_ids": [4], "response_logprobs": [-0.4], "response_model_steps": [0],
         "response_mask": [1]},
    ]
    batch, metrics = build([Group.from_samples([a, b])], "mask", "drgrpo")
    assert batch.input_ids.shape[0] == 4 and metrics["rollout/branch_rows"] == 2
    assert batch.input_ids[2, :6].tolist() == [1, 2, 5, 7, 8, 9] and batch.input_ids[3, :2].tolist() == [3, 4]
    assert batch.response_mask[2].tolist()[:6] == [0, 0, 0, 1, 0, 1]
    assert batch.rollout_logprobs[2, 3:6].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch.model_steps[2, 3:6].tolist() == [1, 1, 1] and batch.model_steps[3, 1].item() == 0
    assert batch.advantages[2, 3].item() == batch.advantages[0, 2].item() == 0.5
    assert batch.advantages[2, 4].item() == 0.0  # an inserted token: no advantage
    assert batch.scores.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert metrics["rollout/num_response_tokens"] == 2 + 2 + 3 + 1
