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


# ----------------------------------------------------------------------------- a critic of another tokenizer
@pytest.mark.parametrize("policy, critic", [("model=tiny_chat", "assets/tiny-arith"),
                                            ("model=default", "assets/tiny-chat")])
def test_a_critic_of_another_tokenizer_is_refused_both_ways(tmp_path, policy, critic):
    """tiny-chat's policy with tiny-arith's critic trained silently; the reverse crashed at step 1."""
    refused(["engine=sim", "logger.mode=disabled", policy, "algo=ppo", f"algo.critic.path={critic}"], tmp_path,
            [f"algo.critic.path='{critic}' is not allowed", "tokenizers differ", "vocabulary of"])


def test_tokenizer_differences_name_what_differs_and_allow_a_padded_embedding(tmp_path):
    """The reusable check (a distillation teacher needs the same): two folders in, the differences out."""
    import json
    import shutil

    from rlharness.model.tokenizer_match import tokenizer_differences
    from tests.helpers import ROOT

    arith = ROOT / "assets" / "tiny-arith"
    assert tokenizer_differences(arith, arith) == []
    padded = tmp_path / "padded"  # the same tokenizer, an embedding with spare rows (Qwen's sizes differ so)
    shutil.copytree(arith, padded)
    config = json.loads((padded / "config.json").read_text())
    config["vocab_size"] += 40
    (padded / "config.json").write_text(json.dumps(config))
    assert tokenizer_differences(arith, padded) == []
    short = tmp_path / "short"  # an embedding without rows for some of the other's ids
    shutil.copytree(arith, short)
    config["vocab_size"] = 10
    (short / "config.json").write_text(json.dumps(config))
    assert tokenizer_differences(arith, short) == [
        "the second's embedding has 10 rows (config.json vocab_size), the first's tokenizer makes ids up to 23"]
    swapped = tmp_path / "swapped"  # two tokens' ids exchanged: same size, other meanings
    shutil.copytree(arith, swapped)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    found = tokenizer_differences(arith, swapped)
    assert len(found) == 1 and found[0].startswith("2 token(s) with other ids"), found
    chat = tokenizer_differences(ROOT / "assets" / "tiny-chat", ROOT / "assets" / "tiny-chat", chat_template=True)
    assert chat == []
