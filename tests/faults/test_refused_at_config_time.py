"""Values that used to fail only once the run started (a traceback, exit 1, a new directory) or
silently misbehave are refused by the config's validation, under their own key (issue 22, item 7)."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import compose_checked
from tests.faults.test_refused_input import SIM, refused

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("overrides, expect", [
    # torch's AdamW refuses these only at its first step.
    (["algo.adam_beta1=2"], ["algo.adam_beta1=2.0", "0 <= beta < 1"]),
    (["algo.adam_beta2=1"], ["algo.adam_beta2=1.0", "0 <= beta < 1"]),
    (["algo.weight_decay=nan"], ["algo.weight_decay=nan", "finite"]),
    (["algo.weight_decay=-0.1"], ["algo.weight_decay=-0.1", ">= 0"]),
    # 2 digits: 10^4 distinct problems, fewer than the default 20000 + 200 (the draw could not end).
    (["task.digits=2"], ["task.num_train + task.num_eval = 20200", "task.digits=2", "10000"]),
    (["task.operators=[+,+]"], ["task.operators", "distinct"]),  # counted twice: the same problems
    (["task.operators=[]"], ["task.operators", "one or more"]),
    (["task.seed=-1"], ["task.seed=-1"]),
    (["task.num_eval=-1"], ["task.num_eval=-1"]),
    (["strategy=async", "strategy.over_sample_threshold=inf"], ["strategy.over_sample_threshold=inf", "finite"]),
    (["strategy=async", "strategy.over_sample_threshold=1e9"], ["strategy.over_sample_threshold=1000000000.0"]),
    (["algo.min_lr_ratio=-5"], ["algo.min_lr_ratio=-5.0", "0 <= ratio <= 1"]),  # a negative LR: gradient ascent
    (["algo.min_lr_ratio=2"], ["algo.min_lr_ratio=2.0"]),
    (["algo.entropy_coef=-0.01"], ["algo.entropy_coef=-0.01", "entropy minimisation is not supported"]),
    (["algo.tis_cap=1e-30"], ["algo.tis_cap=1e-30", "0 (disables", ">= 1"]),
    (["algo.tis_cap=0.5"], ["algo.tis_cap=0.5"]),  # would down-weight on-policy tokens too
    (["algo.warmup_steps=-3"], ["algo.warmup_steps=-3"]),
    (["algo.clip_eps_low=0"], ["algo.clip_eps_low=0.0", "> 0"]),
    (["algo.clip_eps_high=inf"], ["algo.clip_eps_high=inf", "finite"]),
    (["eval.temperature=nan"], ["eval.temperature=nan", "finite"]),  # its own key, not agent.sampling's
    (["eval.temperature=-1"], ["eval.temperature=-1.0"]),
    (["eval.max_tokens=-1"], ["eval.max_tokens=-1"]),
    (["engine=sim", "engine.time_per_token_s=-1"], ["engine.time_per_token_s=-1.0"]),
    (["engine=sim", "engine.max_len=-1"], ["engine.max_len=-1"]),
    (["backend=sim", "backend.step_time_s=-1"], ["backend.step_time_s=-1.0"]),
    (["cluster=local_ray", "cluster.num_cpus=0"], ["cluster.num_cpus=0"]),
    (["cluster=local_ray", "cluster.trainer_cpus=0"], ["cluster.trainer_cpus=0.0"]),
    (["cluster=slurm", "cluster.timeout_min=0"], ["cluster.timeout_min=0"]),
    (["cluster=slurm", "cluster.ray_port=70000"], ["cluster.ray_port=70000"]),
    (["trainer.max_nonfinite_steps=0"], ["trainer.max_nonfinite_steps=0"]),
    # Hydra's own syntax errors, said as what to type instead.
    (["judger=router", "+judger.weights.math=1.0"], ["+judger.weights.math=1.0", "without the '+'",
                                                     "(judger.weights.math=1.0)"]),
    (["judger=router", "judger.format_pattern=(?s).*#### \\d+"],
     ["Hydra reads ( ) \\ a space in a value as syntax", "\"judger.format_pattern='...'\""]),
])
def test_refused_by_the_config(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    for word in expect:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("overrides", [
    ["algo.tis_cap=0"], ["algo.tis_cap=1"], ["algo.min_lr_ratio=0"], ["algo.min_lr_ratio=1"],
    ["algo.adam_beta1=0"], ["eval.temperature=0"], ["task.digits=3", "task.num_train=999000"],
])
def test_edge_values_that_work_stay_allowed(overrides):
    compose_checked(overrides)


@pytest.mark.parametrize("args, expect", [
    (["task.digits=2"], ["task.digits=2", "distinct problems"]),
    (["algo.adam_beta1=2"], ["algo.adam_beta1=2.0"]),
])
def test_refused_on_the_command_line_with_exit_2_and_no_directory(tmp_path, args, expect):
    refused([*SIM, *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()
