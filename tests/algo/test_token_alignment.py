"""Token by token: advantages, masks and log-probs of a built batch sit at the same positions.

The seeds shifted advantages one token against the labels. Here a hand-built batch
(two samples with different prompt and response lengths, right padding) is checked
position by position, and a loss gradient is checked to reach exactly the logits
that predict response tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.losses import aggregate_loss, clipped_policy_loss, token_logprobs
from rlharness.config.schema import AlgoConf
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status

PAD, VOCAB = 0, 7


def sample(uid: str, prompt: list[int], response: list[int], logprobs: list[float], steps: list[int],
           score: float) -> RolloutState:
    return RolloutState(uid=uid, group_id="g", task="t", prompt_index=0, epoch=0, prompt_text="",
                        prompt_ids=prompt, response_ids=response, response_logprobs=logprobs,
                        response_model_steps=steps, reward={"score": score}, status=Status.COMPLETED,
                        finish_reason="stop")


A = sample("a", [1, 2, 3], [4, 5], [-0.4, -0.5], [3, 4], score=1.0)  # 5 tokens, padded by 1
B = sample("b", [5, 1], [2, 3, 4, 6], [-1.1, -1.2, -1.3, -1.4], [2, 2, 3, 3], score=0.0)  # 6 tokens
DRGRPO = AlgoConf(name="drgrpo", advantage="drgrpo")  # advantages r - mean: +0.5 for A, -0.5 for B


def group(*samples: RolloutState) -> Group:
    return Group.from_samples(list(samples))


def build():
    return build_train_batch([group(A, B)], DRGRPO, pad_token_id=PAD, train_step=7, max_response_len=8, temperature=1.0)


def test_batch_tensors_by_hand():
    batch, _ = build()
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, PAD], [5, 1, 2, 3, 4, 6]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.advantages.tolist() == [[0, 0, 0, 0.5, 0.5, 0], [0, 0, -0.5, -0.5, -0.5, -0.5]]
    torch.testing.assert_close(batch.rollout_logprobs,
                               torch.tensor([[0, 0, 0, -0.4, -0.5, 0], [0, 0, -1.1, -1.2, -1.3, -1.4]]))
    assert batch.model_steps.tolist() == [[-1, -1, -1, 3, 4, -1], [-1, -1, 2, 2, 3, 3]]
    assert (batch.train_step, batch.num_groups, batch.max_response_len, batch.temperature) == (7, 1, 8, 1.0)


def logits_matching_rollout(batch) -> torch.Tensor:
    """Logits whose next-token distribution gives each response token exactly its rollout prob.

    At position t - 1 the target token of position t gets probability q = exp(rollout
    logprob) and the other tokens share 1 - q; prompt tokens get q = 0.3.
    """
    bsz, width = batch.input_ids.shape
    logits = torch.zeros(bsz, width, VOCAB)
    for b in range(bsz):
        for t in range(1, width):
            q = math.exp(batch.rollout_logprobs[b, t].item()) if batch.response_mask[b, t] else 0.3
            probs = torch.full((VOCAB,), (1 - q) / (VOCAB - 1))
            probs[batch.input_ids[b, t]] = q
            logits[b, t - 1] = probs.log()
    return logits


def test_each_response_token_has_its_logprob_advantage_and_mask_at_one_position():
    batch, _ = build()
    lp = token_logprobs(logits_matching_rollout(batch), batch.input_ids)
    for b, s in enumerate([A, B]):
        start = len(s.prompt_ids)
        for j, tok in enumerate(s.response_ids):
            pos = start + j
            assert batch.input_ids[b, pos].item() == tok
            assert batch.response_mask[b, pos].item() == 1
            assert batch.advantages[b, pos].item() == pytest.approx(0.5 if s is A else -0.5)
            assert batch.rollout_logprobs[b, pos].item() == pytest.approx(s.response_logprobs[j])
            assert lp[b, pos].item() == pytest.approx(s.response_logprobs[j], abs=1e-5)
            assert batch.model_steps[b, pos].item() == s.response_model_steps[j]
        # Prompt and padding positions are masked out and carry nothing.
        outside = [t for t in range(batch.input_ids.shape[1]) if not start <= t < start + len(s.response_ids)]
        for t in outside:
            assert batch.response_mask[b, t].item() == 0
            assert batch.advantages[b, t].item() == 0
            assert batch.model_steps[b, t].item() == -1
    # Prompt positions after the first got q = 0.3, so the shift is not accidentally right.
    assert lp[0, 1].item() == pytest.approx(math.log(0.3), abs=1e-5)


def test_loss_gradient_reaches_exactly_the_logits_that_predict_response_tokens():
    batch, _ = build()
    logits = logits_matching_rollout(batch).requires_grad_()
    lp = token_logprobs(logits, batch.input_ids)
    loss_tok, _ = clipped_policy_loss(lp, lp.detach(), batch.advantages, 0.2, 0.2)
    aggregate_loss(loss_tok, batch.response_mask, "token_mean").backward()
    has_grad = logits.grad.abs().sum(-1) > 0  # [B, T]
    predicts_response = torch.zeros_like(has_grad)
    predicts_response[:, :-1] = batch.response_mask[:, 1:] > 0
    assert has_grad.tolist() == predicts_response.tolist()
    # The advantage sign decides the direction: A (adv +0.5) pushes its tokens' logits up.
    assert logits.grad[0, 2, 4].item() < 0  # logits at 2 predict A's first response token (4)
    assert logits.grad[1, 1, 2].item() > 0  # B has adv -0.5: its first response token (2) pushed down


def test_rollout_metrics():
    _, metrics = build()
    assert metrics["rollout/reward_mean"] == pytest.approx(0.5)
    assert metrics["rollout/response_len_mean"] == pytest.approx(3.0)
    assert metrics["rollout/adv_abs_mean"] == pytest.approx(0.5)
    assert metrics["rollout/groups_zero_signal_frac"] == 0.0
    assert metrics["rollout/num_response_tokens"] == 6


def test_zero_signal_groups_stay_in_the_batch():
    same = [sample("c", [1], [2], [-0.1], [0], 1.0), sample("d", [1], [3], [-0.2], [0], 1.0)]
    batch, metrics = build_train_batch([group(A, B), group(*same)], DRGRPO, PAD, 1, 8, 1.0)
    assert batch.input_ids.shape[0] == 4 and batch.num_groups == 2
    assert batch.advantages[2:].abs().sum().item() == 0
    assert batch.response_mask[2:].sum().item() == 2
    assert metrics["rollout/groups_zero_signal_frac"] == 0.5


def test_greedy_temperature_scores_at_one():
    batch, _ = build_train_batch([group(A, B)], DRGRPO, PAD, 1, 8, temperature=0.0)
    assert batch.temperature == 1.0


def test_bad_input_is_named():
    unjudged = sample("u", [1], [2], [-0.1], [0], 0.0)
    unjudged.reward = None
    with pytest.raises(ValueError, match="uid=u"):
        build_train_batch([group(A, unjudged)], DRGRPO, PAD, 1, 8, 1.0)
    ragged = sample("r", [1], [2, 3], [-0.1], [0, 0], 0.0)
    with pytest.raises(ValueError, match="uid=r"):
        build_train_batch([group(A, ragged)], DRGRPO, PAD, 1, 8, 1.0)
    with pytest.raises(ValueError, match="same, non-zero size"):
        build_train_batch([group(A, B), group(A)], DRGRPO, PAD, 1, 8, 1.0)
