"""Per-token loss mask: tokens a loop inserted (tool output) sit in the batch but get no loss.

A sample whose response is model tokens, then tool-output tokens (mask 0), then model
tokens again is built into a batch and checked position by position; the loss gradient
must reach exactly the logits that predict *model* tokens, and the loss denominator
counts only them.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlharness.algo.losses import aggregate_loss, clipped_policy_loss, loss_denominator, token_logprobs
from rlharness.config.schema import AlgoConf
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status

PAD, VOCAB = 0, 9
DRGRPO = AlgoConf(name="drgrpo", advantage="drgrpo")  # advantages r - mean: +0.5 / -0.5


def sample(uid: str, prompt: list[int], score: float) -> RolloutState:
    return RolloutState(uid=uid, group_id="g", task="t", prompt_index=0, epoch=0, prompt_text="",
                        prompt_ids=prompt, reward={"score": score}, status=Status.COMPLETED, finish_reason="stop")


def tool_sample() -> RolloutState:
    s = sample("tool", [1, 2], 1.0)
    s.append_tokens([3, 4], [-0.3, -0.4], [2, 2])  # the model writes a call
    s.append_tokens([5, 6, 7], [0.0, 0.0, 0.0], [2, 2, 2], mask=[0, 0, 0])  # the loop inserts its output
    s.append_tokens([8], [-0.8], [3])  # the model goes on (newer weights)
    return s


def plain_sample() -> RolloutState:
    s = sample("plain", [1], 0.0)
    s.response_ids, s.response_logprobs, s.response_model_steps = [4, 5], [-1.4, -1.5], [3, 3]  # no mask: all ones
    return s


def build():
    return build_train_batch([Group.from_samples([tool_sample(), plain_sample()])], DRGRPO, PAD, train_step=5,
                             max_response_len=8, temperature=1.0)


def test_state_mask_bookkeeping_and_serialisation():
    s = tool_sample()
    assert s.response_mask == [1, 1, 0, 0, 0, 1] == s.loss_mask()
    assert (s.min_policy_version, s.max_policy_version) == (2, 3)
    again = RolloutState.from_dict(s.to_dict())
    assert again.response_mask == s.response_mask and again.response_ids == s.response_ids
    old = s.to_dict()
    del old["response_mask"]  # a state saved before the field existed
    assert RolloutState.from_dict(old).loss_mask() == [1] * 6
    legacy = plain_sample()
    legacy.append_tokens([9], [-0.9], [4], mask=[0])  # implicit ones become explicit first
    assert legacy.response_mask == [1, 1, 0]
    s.reset_response()
    assert s.response_mask == [] and s.loss_mask() == []
    with pytest.raises(ValueError, match="mask=1"):
        s.append_tokens([1, 2], [0.0, 0.0], [0, 0], mask=[1])
    s.response_ids, s.response_mask = [1, 2], [1]
    with pytest.raises(ValueError, match="response_mask"):
        s.loss_mask()


def test_tool_tokens_are_in_the_input_but_masked_with_zero_advantage():
    batch, metrics = build()
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8], [1, 4, 5, PAD, PAD, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1], [0, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.advantages.tolist() == [[0, 0, .5, .5, 0, 0, 0, .5], [0, -.5, -.5, 0, 0, 0, 0, 0]]
    torch.testing.assert_close(batch.rollout_logprobs, torch.tensor(
        [[0, 0, -0.3, -0.4, 0, 0, 0, -0.8], [0, -1.4, -1.5, 0, 0, 0, 0, 0]]))
    # Tool tokens keep the version of the call they answer, so staleness is unchanged.
    assert batch.model_steps.tolist() == [[-1, -1, 2, 2, 2, 2, 2, 3], [-1, 3, 3, -1, -1, -1, -1, -1]]
    assert loss_denominator(batch.response_mask, "token_mean") == 5  # 3 model tokens + 2
    assert metrics["rollout/num_response_tokens"] == 8  # lengths still count every token


def test_loss_gradient_skips_the_logits_that_predict_tool_tokens():
    batch, _ = build()
    bsz, width = batch.input_ids.shape
    torch.manual_seed(0)
    logits = torch.randn(bsz, width, VOCAB, requires_grad=True)
    lp = token_logprobs(logits, batch.input_ids)
    loss_tok, _ = clipped_policy_loss(lp, lp.detach(), batch.advantages, 0.2, 0.2)
    loss = aggregate_loss(loss_tok, batch.response_mask, "token_mean")
    loss.backward()
    has_grad = (logits.grad.abs().sum(-1) > 0).tolist()
    # Logits at t-1 predict token t: only model tokens (mask 1) pull gradient.
    assert has_grad[0] == [False, True, True, False, False, False, True, False]
    assert has_grad[1] == [True, True, False, False, False, False, False, False]
    # The loss is the mean over the 5 model tokens only: -adv * ratio(=1) each.
    assert loss.item() == pytest.approx(-(3 * 0.5 + 2 * -0.5) / 5)
    assert not math.isnan(loss.item())
