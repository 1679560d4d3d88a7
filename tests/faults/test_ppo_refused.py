"""algo=ppo's bad input: one `error:` line naming the key, before anything starts (issue 26)."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import compose_checked
from tests.faults.test_refused_input import refused

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("overrides, expect", [
    (["algo=ppo", "algo.critic.lr=0"], ["algo.critic.lr=0", "> 0"]),
    (["algo=ppo", "algo.critic.lr=-1e-5"], ["algo.critic.lr=-1e-05", "> 0"]),
    (["algo=ppo", "algo.critic.lr=nan"], ["algo.critic.lr=nan", "finite"]),
    (["algo=ppo", "algo.critic.cliprange_value=0"], ["algo.critic.cliprange_value=0", "> 0"]),
    (["algo=ppo", "algo.critic.warmup_steps=-1"], ["algo.critic.warmup_steps=-1"]),
    (["algo=ppo", "algo.critic.grad_clip=-1"], ["algo.critic.grad_clip=-1"]),
    (["algo=ppo", "algo.gamma=1.5"], ["algo.gamma=1.5", "0 <= gamma <= 1"]),
    (["algo=ppo", "algo.lam=-0.1"], ["algo.lam=-0.1", "0 <= lam <= 1"]),
    (["algo=ppo", "algo.kl_reward_coef=-1"], ["algo.kl_reward_coef=-1"]),
    (["algo=grpo", "algo.kl_reward_coef=0.1"], ["algo.kl_reward_coef=0.1", "algo.advantage=grpo", "algo.kl_coef"]),
])
def test_refused_by_the_config(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    for word in expect:
        assert word in str(err.value), str(err.value)


def test_ppo_allows_one_sample_per_prompt():
    # The critic is the baseline: prompt_repeat_k=1 (refused for the group baselines) is fine.
    compose_checked(["algo=ppo", "sampler.prompt_repeat_k=1"])
    with pytest.raises(ConfigError, match="prompt_repeat_k=1"):
        compose_checked(["algo=grpo", "sampler.prompt_repeat_k=1"])


@pytest.mark.parametrize("args, expect", [
    (["algo=ppo", "algo.critic.lr=0"], ["algo.critic.lr=0"]),
    (["algo=ppo", "algo.critic.path=no/such/critic"], ["algo.critic.path='no/such/critic'", "no Hugging Face"]),
])
def test_refused_on_the_command_line_with_exit_2_and_no_directory(tmp_path, args, expect):
    refused(["logger.mode=disabled", *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()
