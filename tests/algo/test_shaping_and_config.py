"""DAPO overlong shaping, the truncation mask, and the algorithm settings a run refuses."""

from __future__ import annotations

import pytest
import torch

from rlharness.algo.shaping import overlong_penalty
from rlharness.config.schema import AlgoConf, ConfigError
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status
from tests.helpers import compose_conf


def test_overlong_penalty_hand_values():
    # budget 8, buffer 4: no penalty up to 4 tokens, then (4 - n) / 4, -1 at 8
    lens = torch.tensor([3, 4, 5, 6, 8])
    torch.testing.assert_close(overlong_penalty(lens, 8, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    torch.testing.assert_close(overlong_penalty(lens, 8, 4, factor=0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))
    assert (overlong_penalty(lens, 8, 0) == 0).all()


def _group(lens, finish, scores, task="t"):
    return Group.from_samples([
        RolloutState(uid=f"u{i}", group_id="g", task=task, prompt_index=0, epoch=0, prompt_text="",
                     prompt_ids=[5, 6], response_ids=[7] * n, response_logprobs=[-1.0] * n,
                     response_model_steps=[0] * n, reward={"score": s}, status=Status.COMPLETED, finish_reason=f)
        for i, (n, f, s) in enumerate(zip(lens, finish, scores))])


def test_batch_applies_overlong_penalty_before_advantages_and_masks_truncated():
    group = _group([2, 6, 8], ["stop", "stop", "length"], [1.0, 1.0, 1.0])
    algo = AlgoConf(name="t", advantage="drgrpo", overlong_buffer_len=4, mask_truncated=True)
    batch, metrics = build_train_batch([group], algo, pad_token_id=0, train_step=1, max_response_len=8,
                                       temperature=1.0)
    # scores 1 + [0, -0.5, -1] = [1, 0.5, 0]: mean 0.5 -> advantages [0.5, 0, -0.5]
    assert batch.advantages[0, 2].item() == pytest.approx(0.5)
    assert batch.advantages[1].abs().sum().item() == 0.0
    # the truncated response gets no loss (and so no advantage on its tokens)
    assert batch.response_mask[2].sum().item() == 0.0 and batch.advantages[2].abs().sum().item() == 0.0
    assert batch.response_mask[0].sum().item() == 2 and batch.response_mask[1].sum().item() == 6
    assert metrics["rollout/truncated_masked_frac"] == pytest.approx(1 / 3)
    assert metrics["rollout/overlong_penalty_mean"] == pytest.approx(-0.5)
    # all rewards equal and no shaping: exactly zero advantages
    batch, _ = build_train_batch([group], AlgoConf(name="t"), 0, 1, max_response_len=8, temperature=1.0)
    assert (batch.advantages == 0).all()


@pytest.mark.parametrize("kw, key", [
    (dict(policy_loss="gspo"), "algo.loss_agg"),
    (dict(policy_loss="trpo"), "algo.policy_loss"),
    (dict(clip_ratio_c=1.0), "algo.clip_ratio_c"),
    (dict(tis_level="batch"), "algo.tis_level"),
    (dict(rejection="seq"), "algo.rejection"),
    (dict(rejection_low=1.0), "algo.rejection_low"),
    (dict(rejection_high=1.0), "algo.rejection_high"),
    (dict(overlong_buffer_len=-1), "algo.overlong_buffer_len"),
])
def test_bad_algo_settings_are_refused_naming_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        AlgoConf(name="t", **kw)


def test_gspo_with_its_aggregation_and_the_algo_gspo_option():
    AlgoConf(name="t", policy_loss="gspo", loss_agg="seq_mean_token_mean")
    conf, _ = compose_conf(["algo=gspo"])
    assert conf.algo.policy_loss == "gspo" and conf.algo.loss_agg == "seq_mean_token_mean"
    # the paper's clip range for sequence ratios, not PPO's 0.2
    assert (conf.algo.clip_eps_low, conf.algo.clip_eps_high) == (3e-4, 4e-4)


def test_prompt_repeat_k_one_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="prompt_repeat_k=1 .*advantage 0"):
        compose_conf(["sampler.prompt_repeat_k=1"])


def test_overlong_buffer_must_fit_the_budget():
    with pytest.raises(ConfigError, match="algo.overlong_buffer_len=8 must be < agent.sampling.max_tokens=8"):
        compose_conf(["algo.overlong_buffer_len=8"])


def test_strategy_max_staleness_is_the_runs_bound():
    # Given alone, strategy.max_staleness is what the replay buffer and manager use (it was ignored).
    conf, _ = compose_conf(["strategy=async", "strategy.max_staleness=3"])
    assert conf.max_staleness == 3 and conf.strategy.max_staleness == 3
    conf, _ = compose_conf(["strategy=async", "max_staleness=2"])
    assert conf.max_staleness == 2 and conf.strategy.max_staleness == 2
    with pytest.raises(ConfigError, match="strategy.max_staleness=3 differs from max_staleness=1"):
        compose_conf(["strategy=async", "max_staleness=1", "strategy.max_staleness=3"])
    # An explicit 0 is a setting too, not "the default, so adopt the strategy's".
    with pytest.raises(ConfigError, match="strategy.max_staleness=3 differs from max_staleness=0"):
        compose_conf(["strategy=async", "max_staleness=0", "strategy.max_staleness=3"])


def test_overlong_penalty_uses_each_groups_own_task_budget():
    # Budgets 16 and 64, buffer 8: the 16-token task's lengths [4, 12, 16, 16] are penalised within its
    # own buffer (8..16), not the run's largest budget (56..64, where they would all get 0).
    short = _group([4, 12, 16, 16], ["stop", "stop", "length", "length"], [0.0, 0.0, 0.0, 0.0])
    long = _group([4, 12, 16, 60], ["stop"] * 4, [0.0, 0.0, 0.0, 0.0], task="long")
    algo = AlgoConf(name="t", advantage="drgrpo", overlong_buffer_len=8)
    batch, metrics = build_train_batch([short, long], algo, pad_token_id=0, train_step=1, max_response_len=64,
                                       temperature=1.0, task_budgets={"t": 16, "long": 64})
    penalties = torch.tensor([0.0, -0.5, -1.0, -1.0, 0.0, 0.0, 0.0, -0.5])
    assert metrics["rollout/overlong_penalty_mean"] == pytest.approx(float(penalties.mean()))
    # Dr.GRPO advantages are the shaped scores minus the group mean: the short group's are [0.625, 0.125, -0.375, -0.375]
    adv = [batch.advantages[b][batch.response_mask[b] > 0][0].item() for b in range(8)]
    assert adv[:4] == pytest.approx([0.625, 0.125, -0.375, -0.375])
    assert adv[4:] == pytest.approx([0.125, 0.125, 0.125, -0.375])
