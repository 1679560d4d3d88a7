"""The `health` config section: bad input is one line naming the key, exit 2, before anything starts
(unknown monitor names, thresholds that are not finite, `on_alarm` outside warn|stop); per-monitor
actions fall back to the run's."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError, HealthConf
from rlharness.launch.preflight import compose_checked, compose_typed
from tests.faults.test_refused_input import SIM, refused

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("overrides, expect", [
    (["health.monitors=[entropy_collapse,reward_hackin]"], ["health.monitors[]='reward_hackin'", "reward_hacking"]),
    (["health.on_alarm=halt"], ["health.on_alarm='halt'", "warn, stop"]),
    (["health.reward_hacking.on_alarm=panic"], ["health.reward_hacking.on_alarm='panic'", "warn or stop"]),
    (["health.entropy_collapse.min_ratio=nan"], ["health.entropy_collapse.min_ratio=nan", "finite"]),
    (["health.host_memory.max_mb_per_step=inf"], ["health.host_memory.max_mb_per_step=inf", "finite"]),
    (["health.reward_hacking.drop_z=-inf"], ["health.reward_hacking.drop_z=-inf", "finite"]),
    (["health.kl_acceleration.ratio=1"], ["health.kl_acceleration.ratio=1.0", "> 1"]),
    (["health.degenerate_outputs.ngram=0"], ["health.degenerate_outputs.ngram=0"]),
    (["health.reward_frozen.window_steps=2"], ["health.reward_frozen.window_steps=2", ">= 3"]),
    (["+health.entropy.min_ratio=0.1"], ["health.entropy", "HealthConf has no key 'entropy'"]),
])
def test_refused_by_the_config(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    for word in expect:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("args, expect", [
    (["health.monitors=[entropy_collapse,bogus]"], ["health.monitors[]='bogus'"]),
    (["health.kl_acceleration.min_kl=nan"], ["health.kl_acceleration.min_kl=nan", "finite"]),
    (["health.zero_signal.on_alarm=maybe"], ["health.zero_signal.on_alarm='maybe'"]),
])
def test_refused_on_the_command_line_with_exit_2_and_no_directory(tmp_path, args, expect):
    refused([*SIM, *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()


def test_each_monitor_takes_the_runs_action_unless_it_has_its_own():
    _, conf = compose_typed(["health.on_alarm=stop", "health.reward_frozen.on_alarm=warn", "health.monitors=[]"])
    assert isinstance(conf.health, HealthConf)
    assert conf.health.action("reward_hacking") == "stop" and conf.health.action("reward_frozen") == "warn"
    assert conf.health.monitors == []  # every monitor off is allowed
